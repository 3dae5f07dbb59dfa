"""The real runtime says when it is not the cluster it emulates: a run whose workers need
more cores than the profile's step times leave is refused before any process starts, and
a run's steps that ran longer than drawn are counted in summary.json (`overrun`)."""

from __future__ import annotations

import json

import pytest

from stalebench import experiment
from stalebench.errors import ConfigError
from stalebench.runtime import compute
from tests.conftest import compose, fast_with, run_job


def test_64_real_workers_on_2_cores_are_refused_before_any_process_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(compute, "cores", lambda: 2)
    cfg = compose(["cluster.num_workers=64"])  # the README's default job, 64 workers
    cfg.run_dir = str(tmp_path / "run")
    with pytest.raises(ConfigError) as refused:
        experiment.run(cfg)
    message = str(refused.value)
    assert "cluster.num_workers=64" in message and "2 cores" in message
    assert "runtime=sim" in message and "oversubscribe=true" in message
    assert not (tmp_path / "run").exists()  # nothing started, nothing written


def test_the_default_job_fits_on_2_cores_and_oversubscribe_accepts_the_rest(monkeypatch):
    monkeypatch.setattr(compute, "cores", lambda: 2)
    experiment.prepare(compose([]))  # the README's default job: 4 workers
    experiment.prepare(compose(["cluster.num_workers=64", "oversubscribe=true"]))


def test_the_check_counts_each_worker_at_its_own_speed(monkeypatch):
    monkeypatch.setattr(compute, "cores", lambda: 2)
    cfg = compose(["cluster=homogeneous", "cluster.compute_ms=10", "cluster.num_workers=8"])
    # 8 workers, a step of 3 ms of CPU every 10 ms: 2.4 cores
    with pytest.raises(ConfigError, match="need 2.4 cores"):
        experiment.check_cores(cfg, 8, None, None, step_s=0.003)
    # half of them 3× slower: 4 × 0.3 + 4 × 0.1 = 1.6 cores
    slow = compose(["cluster=homogeneous", "cluster.compute_ms=10", "cluster.num_workers=8",
                    "cluster.slow_fraction=0.5", "cluster.slow_factor=3"])  # fmt: skip
    experiment.check_cores(slow, 8, None, None, step_s=0.003)
    # real compute only: no step time to keep
    free = compose(["cluster=homogeneous", "cluster.compute_ms=0", "cluster.num_workers=64"])
    experiment.check_cores(free, 64, None, None, step_s=0.003)


@pytest.mark.timeout(60)
def test_a_run_counts_the_steps_that_ran_longer_than_drawn(tmp_path, capsys):
    # 1 µs steps: no real step is that short (refused, unless asked for)
    over = run_job(
        tmp_path / "over",
        ["cluster.compute_ms=0.001", "budget.max_updates=40", "oversubscribe=true"],
    )
    assert over.summary["status"] == "completed", over.summary["error"]
    overrun = over.summary["overrun"]
    assert overrun["steps"] >= 40 and overrun["fraction"] > 0.9
    assert json.loads((over.dir / "summary.json").read_text())["overrun"] == overrun
    from stalebench.cli import _overrun_line

    assert "ran longer than the profile drew" in _overrun_line(overrun)
    # real compute only: nothing is timed, nothing counted
    free = run_job(tmp_path / "free", ["cluster.compute_ms=0", "budget.max_updates=20"])
    assert "overrun" not in free.summary
    # what a step's duration was: padded to the profile's draw, or as long as it took
    assert (over.summary["step_time"], free.summary["step_time"]) == ("emulated", "measured")
    # the report names the run that overran, and only it
    from stalebench.report.cli import build_report

    report = build_report([str(over.dir), str(free.dir)], tmp_path / "report").read_text()
    section = report.split("## Runs that were not the cluster asked for")[1]
    assert str(over.dir) in section and str(free.dir) not in section


def test_a_generous_profile_is_kept(tmp_path):
    cfg = compose(fast_with(["cluster.compute_ms=50", "budget.max_updates=12"]))
    cfg.run_dir = str(tmp_path / "kept")
    summary = experiment.run(cfg)
    assert summary["overrun"]["fraction"] <= summary["overrun"]["limit"]


@pytest.mark.timeout(120)
def test_a_run_counts_its_network_waits_and_those_that_woke_late(tmp_path):
    net = ["cluster.push_latency_ms=2", "cluster.pull_latency_ms=2", "budget.max_updates=30"]
    ps = run_job(tmp_path / "ps", net)
    assert ps.summary["status"] == "completed", ps.summary["error"]
    overrun = ps.summary["overrun"]
    # every push slept the model's 2 ms on its worker, every reply's pull on its receiver
    assert overrun["waits"] >= 2 * 30 and 0 <= overrun["late"] <= overrun["waits"]
    assert overrun["late_fraction"] == round(overrun["late"] / overrun["waits"], 4)
    # 10 ms a hop here: a round's real all-reduce must end inside its modelled time on the
    # last replica to join for that one to wait (at 2 ms a hop, 2(N - 1) × 2 ms, it did not
    # in 4 of 10 rounds once beside a sweep's two jobs, load 5 on 2 cores: 6 waits)
    slow = ["cluster.push_latency_ms=10", "cluster.pull_latency_ms=10"]
    allreduce = ["engine=allreduce", "algorithm=bsp", "budget.max_updates=10"]
    rounds = run_job(tmp_path / "allreduce", [*net, *slow, *allreduce])
    assert rounds.summary["status"] == "completed", rounds.summary["error"]
    # each round's all-reduce padded to the ring's 2(N - 1) × 10 ms on the last replica to
    # join at least (an earlier one whose real all-reduce ended past its own modelled end,
    # waiting for that last one, has nothing left to wait: 38 of 40 once in a loaded suite)
    assert rounds.summary["overrun"]["waits"] >= 10
    # nothing modelled, nothing waited
    free = run_job(tmp_path / "free", ["cluster.compute_ms=0", "budget.max_updates=10"])
    assert "overrun" not in free.summary
    # a run whose waits woke late says so, in its line and in the report (its summary.json
    # as a machine whose cores were taken would have written it)
    from stalebench.cli import _overrun_line
    from stalebench.report.cli import build_report

    # (the counts as a machine that kept up would have written them: a loaded machine's own
    # steps and waits can overrun, 12 % of 33 steps and 14 % of 28 waits once in a suite)
    def kept_up(counts: dict) -> dict:
        return {**counts, "overran": 0, "fraction": 0.0, "late": 0, "late_fraction": 0.0}

    late = {**kept_up(overrun), "late": overrun["waits"] // 5, "late_fraction": 0.2}
    assert "20 % of the" in _overrun_line(late) and "network waits woke late" in _overrun_line(late)
    assert _overrun_line(kept_up(overrun)) == ""
    summary = json.loads((ps.dir / "summary.json").read_text())
    (ps.dir / "summary.json").write_text(json.dumps({**summary, "overrun": late}))
    kept = json.loads((rounds.dir / "summary.json").read_text())
    (rounds.dir / "summary.json").write_text(
        json.dumps({**kept, "overrun": kept_up(kept["overrun"])})
    )
    report = build_report([str(ps.dir), str(rounds.dir)], tmp_path / "report").read_text()
    section = report.split("## Runs that were not the cluster asked for")[1]
    assert str(ps.dir) in section and "network waits woke late" in section
    assert str(rounds.dir) not in section
