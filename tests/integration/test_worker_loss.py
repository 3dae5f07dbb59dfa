"""A lost worker, by algorithm: under a barrier that never waits (ASP and the update rules
on it) the parameter server goes on with the survivors and records the loss; under any
other barrier the run fails naming the worker; a lost server always fails the run. The
simulator gives the same outcome deterministically; the real runtime is tried with a
worker killed from outside."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from stalebench import experiment
from stalebench.metrics.events import read_events
from tests.conftest import compose, run_job
from tests.integration.test_cli import FAST, _alive, _pids
from tests.speed_helpers import fork_server_for_every_engine

T = TypeVar("T")


def run_beside(
    run_dir: Path, args: list[str], act: Callable[[threading.Event], T]
) -> tuple[dict, T, float]:
    """The job the CLI runs on `args`, run here (`experiment.run`, in this thread, its ranks
    forked from this process's fork server) into run_dir while `act` runs in another thread,
    given an event set once the run has ended: the run's summary, what `act` returned, and
    when the run ended (time.monotonic). What `act` raised is raised here."""
    cfg = compose(args)
    cfg.run_dir = str(run_dir)
    ended = threading.Event()
    out: dict = {}

    def target() -> None:
        try:
            out["value"] = act(ended)
        except BaseException as exc:  # raised in the test's thread
            out["error"] = exc

    thread = threading.Thread(target=target, name="beside-the-run", daemon=True)
    thread.start()
    try:
        summary = experiment.run(cfg)
    finally:
        end = time.monotonic()
        ended.set()
        thread.join(timeout=60)
    if "error" in out:
        raise out["error"]
    return summary, out["value"], end


def training(run_dir: Path, world: int, updates: int = 20) -> dict[int, int] | None:
    """The ranks' pids once all `world` of them run and more than `updates` updates are
    recorded; else None."""
    pids = _pids(run_dir) if (run_dir / "logs").exists() else {}
    if len(pids) < world:
        return None
    recorded = [e for e in read_events(run_dir / "events.jsonl") if e["kind"] == "update"]
    return pids if len(recorded) > updates else None


def kill_mid_run(run_dir: Path, args: list[str], world: int, rank: int):
    """Run the job on `args` here (`run_beside`), wait until all `world` ranks run and updates
    flow, SIGKILL `rank`: the run's summary, the ranks' pids and the seconds from the kill to
    the run's end (test_cli.kill_mid_run does it through the CLI)."""

    def kill(ended: threading.Event) -> tuple[dict[int, int], float]:
        deadline = time.monotonic() + 60
        while not (pids := training(run_dir, world)):
            assert not ended.is_set() and time.monotonic() < deadline, "the run did not start"
            time.sleep(0.05)
        os.kill(pids[rank], signal.SIGKILL)
        return pids, time.monotonic()

    summary, (pids, killed_at), end = run_beside(run_dir, args, kill)
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    return summary, pids, end - killed_at


@pytest.fixture(scope="module", autouse=True)
def one_fork_server():
    """The real runs here go from engine=ps to engine=local and back: their ranks forked
    from one server (not one started again, torch imported again, at each change)."""
    fork_server_for_every_engine()


DIE = "cluster.faults=[{worker:1,at_s:0.2,action:die}]"
SIM = ["runtime=sim", "budget.max_updates=300", DIE]


def _lost(events):
    return [e for e in events if e["kind"] == "worker" and e["event"] == "lost"]


@pytest.mark.parametrize("algorithm", ["asp", "dana", "gap_aware"])
def test_in_the_simulator_a_barrier_free_run_goes_on_without_a_dead_worker(tmp_path, algorithm):
    runs = [run_job(tmp_path / f"r{i}", [f"algorithm={algorithm}", *SIM]) for i in range(2)]
    summary, events = runs[0].summary, runs[0].events
    assert summary["status"] == "completed" and summary["error"] is None
    assert summary["updates"] == 300 and summary["workers_lost"] == [1]
    assert _lost(events) == [
        {
            "kind": "worker",
            "t": 0.2,
            "worker": 1,
            "event": "lost",
            "reason": "worker 1 died at 0.200 s (a fault injected by cluster.faults)",
        }
    ]
    after = [e for e in events if e["kind"] == "update" and e["t"] > 0.2 + 0.01]
    assert after and {e["worker"] for e in after} == {0, 2, 3}  # the survivors go on
    assert events == runs[1].events  # deterministic, bit for bit


@pytest.mark.parametrize("algorithm", ["ssp", "bsp", "dssp", "psp"])
def test_in_the_simulator_a_waiting_barrier_fails_when_a_worker_dies(tmp_path, algorithm):
    summary = run_job(tmp_path, [f"algorithm={algorithm}", *SIM]).summary
    assert summary["status"] == "failed"
    assert summary["error"] == "worker 1 died at 0.200 s (a fault injected by cluster.faults)"
    assert summary["workers_lost"] == []


def test_in_the_simulator_a_run_that_loses_every_worker_fails(tmp_path):
    faults = ",".join(f"{{worker:{w},at_s:0.1,action:die}}" for w in range(4))
    summary = run_job(
        tmp_path,
        ["algorithm=asp", "runtime=sim", "budget.max_updates=300", f"cluster.faults=[{faults}]"],
    ).summary
    assert summary["status"] == "failed"
    assert summary["error"].startswith("every worker is lost (the last: worker ")
    assert summary["workers_lost"] == [0, 1, 2, 3]  # the fourth loss ends the run


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_real_asp_run_that_loses_one_of_four_workers_completes_with_three(tmp_path):
    run_dir = tmp_path / "run"
    args = ["algorithm=asp", "budget.max_wall_s=3", "timeout_s=10", *FAST[:-1]]
    summary, pids, ended_after = kill_mid_run(run_dir, args, world=5, rank=2)  # worker 1
    events = read_events(run_dir / "events.jsonl")
    assert summary["status"] == "completed", summary["error"]
    assert summary["workers_lost"] == [1]
    (lost,) = _lost(events)
    assert lost["reason"].startswith("worker 1 (rank 2) lost: ")
    after = [e for e in events if e["kind"] == "update" and e["t"] > lost["t"]]
    assert {e["worker"] for e in after} == {0, 2, 3}
    assert summary["final"]["accuracy"] is not None  # evaluated as usual
    assert ended_after < 30, ended_after
    assert not [r for r, pid in pids.items() if _alive(pid)]


STEP_DEATH = "cluster.faults=[{worker:1,at_step:5,action:die}]"


@pytest.mark.parametrize("runtime", ["sim", "real"])
@pytest.mark.timeout(120)
def test_a_worker_that_dies_at_its_step_k_pushed_exactly_k_gradients(tmp_path, runtime):
    # a step-indexed fault strikes when the worker starts step 5, whatever the time: in
    # both runtimes it has pushed steps 0..4, and the others go on, long enough for the
    # server to see the loss (at 60 updates, ~0.1 s after the death, it had not once in a
    # suite on four pytest workers: the run completed with no worker lost)
    run = run_job(
        tmp_path,
        ["algorithm=asp", f"runtime={runtime}", "budget.max_updates=200", "budget.max_wall_s=0"]
        + ["cluster=homogeneous", "cluster.compute_ms=5", "timeout_s=20", STEP_DEATH],
    )
    assert run.summary["status"] == "completed", run.summary["error"]
    assert run.summary["workers_lost"] == [1] and run.summary["updates"] == 200
    clocks = [e["clock"] for e in run.events if e["kind"] == "update" and e["worker"] == 1]
    assert clocks == [0, 1, 2, 3, 4]
    (lost,) = _lost(run.events)
    last_push = max(e["t"] for e in run.events if e["kind"] == "update" and e["worker"] == 1)
    assert lost["t"] >= last_push
    if runtime == "sim":  # it dies when it would start step 5: as step 4's push is answered
        reason = f"worker 1 died at {last_push:.3f} s (a fault injected by cluster.faults)"
        assert lost == {**lost, "t": last_push, "reason": reason}


@pytest.mark.parametrize("runtime", ["sim", "real"])
@pytest.mark.timeout(120)
def test_asynchronous_local_sgd_goes_on_without_a_dead_worker(tmp_path, runtime):
    # engine=local in mode async: nobody waits for a worker, so its loss is recorded and
    # the others go on; worker 1 dies at its inner step 25, in its third round of 10
    run = run_job(
        tmp_path,
        ["algorithm=async_diloco", f"runtime={runtime}", "algorithm.outer.inner_steps=10"]
        + [
            "budget.max_updates=12",
            "budget.max_wall_s=0",
            "cluster=homogeneous",
            "cluster.num_workers=2",
        ]
        + [
            "cluster.compute_ms=2",
            "timeout_s=20",
            "cluster.faults=[{worker:1,at_step:25,action:die}]",
        ],
    )
    assert run.summary["status"] == "completed", run.summary["error"]
    assert run.summary["workers_lost"] == [1] and run.summary["updates"] == 12
    ones = [e for e in run.events if e["kind"] == "update" and e["worker"] == 1]
    assert [e["clock"] for e in ones] == [0, 1]  # two rounds pushed, the third never
    (lost,) = _lost(run.events)
    assert lost["reason"].startswith("worker 1 ")
    after = [e for e in run.events if e["kind"] == "update" and e["t"] > lost["t"]]
    assert after and {e["worker"] for e in after} == {0}


@pytest.mark.parametrize(
    "runtime, algorithm", [("sim", "bsp"), ("sim", "ssp"), ("real", "bsp")], ids=str
)
@pytest.mark.timeout(120)
def test_a_barrier_reformed_over_the_survivors_goes_on(tmp_path, runtime, algorithm):
    # on_loss=reform: worker 1 dies at its step 3; the barrier is the same rule over the
    # other three, and BSP's rounds from then on average three gradients
    run = run_job(
        tmp_path,
        [f"algorithm={algorithm}", f"runtime={runtime}", "algorithm.barrier.on_loss=reform"]
        + ["cluster.num_workers=4", "budget.max_updates=20", "budget.max_wall_s=0"]
        + ["cluster=homogeneous", "cluster.compute_ms=2", "timeout_s=20"]
        + ["cluster.faults=[{worker:1,at_step:3,action:die}]"]
        # 4 real workers at 2 ms a step need more than 2 cores: a loss, not step times
        + ["oversubscribe=true"],
    )
    assert run.summary["status"] == "completed", run.summary["error"]
    assert run.summary["workers_lost"] == [1] and run.summary["updates"] == 20
    updates = [e for e in run.events if e["kind"] == "update"]
    assert [e["clock"] for e in updates if e["worker"] == 1] == [0, 1, 2]
    (lost,) = _lost(run.events)
    after = [e for e in updates if e["t"] > lost["t"]]
    assert after and {e["worker"] for e in after} == {0, 2, 3}
    if algorithm == "bsp":  # a round per version: four pushes before the loss, three after
        per_version = {}
        for e in updates:
            per_version.setdefault(e["version"], []).append(e["worker"])
        assert [sorted(per_version[v]) for v in (1, 2, 3)] == [[0, 1, 2, 3]] * 3
        assert all(sorted(per_version[v]) == [0, 2, 3] for v in range(4, 21))


def _worker_events(events):
    return [(e["t"], e["worker"], e["event"]) for e in events if e["kind"] == "worker"]


def test_in_the_simulator_a_spare_takes_a_dead_workers_place_from_its_clock(tmp_path):
    dies = "{worker:1,at_s:0.1,action:die},{worker:1,at_s:0.25,action:die}"
    args = ["algorithm=asp", "runtime=sim", "budget.max_updates=300", "cluster.spares=1"]
    args.append(f"cluster.faults=[{dies},{{worker:2,at_s:0.15,action:die}}]")
    runs = [run_job(tmp_path / f"r{i}", args) for i in range(2)]
    summary, events = runs[0].summary, runs[0].events
    assert summary["status"] == "completed" and summary["updates"] == 300
    lost_at = [e["t"] for e in _lost(events)]
    # worker 1 dies at its first step start after 0.1 s; its spare goes on at once and is
    # struck by the later death; worker 2 then has no spare left; at the end the worker
    # whose push ended the run is told to stop (as in real processes)
    end = [e["t"] for e in events if e.get("event") == "end"][0]
    *seen, (t_stop, _, stop) = _worker_events(events)
    assert seen == [
        (lost_at[0], 1, "lost"),
        (lost_at[0], 1, "replaced"),
        (lost_at[1], 2, "lost"),
        (lost_at[2], 1, "lost"),
    ]
    assert (t_stop, stop) == (end, "stop")
    assert summary["workers_lost"] == [1, 1, 2] and summary["workers_replaced"] == [1]
    ones = [e for e in events if e["kind"] == "update" and e["worker"] == 1]
    before = [e["clock"] for e in ones if e["t"] <= lost_at[0]]
    after = [e["clock"] for e in ones if lost_at[0] < e["t"] <= lost_at[2]]
    assert after[0] == before[-1] + 1 and after == list(range(after[0], after[0] + len(after)))
    assert max(e["t"] for e in ones) <= lost_at[2]
    assert events == runs[1].events  # deterministic, bit for bit


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_real_spare_takes_the_place_of_a_dead_worker_and_of_a_silent_one(tmp_path):
    faults = "{worker:1,at_s:0.3,action:die},{worker:2,at_s:0.3,duration_s:5}"
    args = ["algorithm=asp", "budget.max_updates=100000", "budget.max_wall_s=5", "timeout_s=2"]
    run = run_job(tmp_path, [*args, "cluster.spares=2", f"cluster.faults=[{faults}]"])
    summary, events = run.summary, run.events
    assert summary["status"] == "completed", summary["error"]
    assert sorted(summary["workers_lost"]) == [1, 2] == summary["workers_replaced"]
    replaced = {
        e["worker"]: e for e in events if e["kind"] == "worker" and e["event"] == "replaced"
    }
    assert {e["by"] for e in replaced.values()} == {"spare 0 (rank 5)", "spare 1 (rank 6)"}
    for w, e in replaced.items():  # its clock goes on, from a fresh process
        clocks = [u["clock"] for u in events if u["kind"] == "update" and u["worker"] == w]
        assert clocks == list(range(len(clocks))) and any(
            u["t"] > e["t"] for u in events if u["kind"] == "update" and u["worker"] == w
        )
    assert "silent for" in next(e["reason"] for e in _lost(events) if e["worker"] == 2)


@pytest.mark.timeout(120)
def test_a_worker_that_dies_just_before_the_end_is_the_runs_loss(tmp_path):
    # worker 1 dies as it starts its step 5, once its 5th push is answered (among the run's
    # first 20 updates); the others reach the 21st a few ms later, mostly before the server
    # can hear of the loss (the dying process is not gone yet): heard after the end, it is
    # still the run's (on the code before, 5 of 5 such runs lost no worker)
    run = run_job(
        tmp_path,
        ["algorithm=asp", "budget.max_updates=21", "budget.max_wall_s=0"]
        + ["cluster=homogeneous", "cluster.compute_ms=5", "timeout_s=20", STEP_DEATH],
    )
    assert run.summary["status"] == "completed", run.summary["error"]
    # when it died, by its own log (to the ms), against the run's end: on a loaded machine
    # its 5th reply can come before the 21st update and its step 5 start only after the
    # end (seen in CI), a death after the end, not the run's loss
    said = re.search(r"worker 1 died at ([0-9.]+) s", (run.dir / "logs/rank-2.log").read_text())
    died, t_end = float(said[1]) if said else None, run.summary["run_time_s"]
    lost = _lost(run.events)
    if died is None or died > t_end + 0.0005:  # it did not die, or died after the end
        assert run.summary["workers_lost"] == [] and not lost
        if died is not None:
            assert "server: after the end" in (run.dir / "logs/rank-0.log").read_text()
    elif died < t_end - 0.0005:  # before the end: the run's loss, heard after it or not
        assert run.summary["workers_lost"] == [1]
        if lost[0]["t"] >= max(e["t"] for e in run.events if e["kind"] == "update"):
            assert lost[0]["reason"].startswith("worker 1 died at")  # heard after the end
            assert lost[0]["reason"].endswith("heard after the run's end")


@pytest.mark.timeout(60)
def test_a_worker_that_dies_after_the_end_is_not_the_runs_loss(tmp_path):
    # asynchronous local SGD, rounds of 10 inner steps: worker 0's every 20 ms, worker 1's
    # every 30 ms (1.5x slower); the 3rd update is worker 0's at 40 ms, the end, while
    # worker 1 is in its second round: it dies at its inner step 15, at 45 ms, after it
    run = run_job(
        tmp_path,
        ["algorithm=async_diloco", "runtime=sim", "algorithm.outer.inner_steps=10"]
        + ["budget.max_updates=3", "budget.max_wall_s=0", "cluster=homogeneous"]
        + ["cluster.num_workers=2", "cluster.compute_ms=2", "cluster.slowdown=[1,1.5]"]
        + ["cluster.faults=[{worker:1,at_step:15,action:die}]"],
    )
    assert run.summary["status"] == "completed", run.summary["error"]
    updates = [(e["worker"], round(e["t"], 6)) for e in run.events if e["kind"] == "update"]
    assert updates == [(0, 0.02), (1, 0.03), (0, 0.04)]
    assert run.summary["workers_lost"] == [] and not _lost(run.events)


@pytest.mark.timeout(120)
def test_a_real_worker_that_dies_after_the_end_is_not_the_runs_loss(tmp_path):
    # as above, but worker 1 pauses 0.2 s as it starts step 3, then dies: its 3rd push was
    # answered well before the end (about 40 ms), it dies after it; the server hears the loss
    # after the end and only logs it (the path a loaded machine took in CI)
    pause = "{worker:1,at_step:3,action:pause,duration_s:0.2}"
    run = run_job(
        tmp_path,
        ["algorithm=asp", "budget.max_updates=21", "budget.max_wall_s=0", "timeout_s=20"]
        + ["cluster=homogeneous", "cluster.compute_ms=5"]
        + [f"cluster.faults=[{pause},{{worker:1,at_step:3,action:die}}]"],
    )
    assert run.summary["status"] == "completed", run.summary["error"]
    assert run.summary["workers_lost"] == [] and not _lost(run.events)
    assert len([e for e in run.events if e["kind"] == "update" and e["worker"] == 1]) == 3
    said = re.search(r"worker 1 died at ([0-9.]+) s", (run.dir / "logs/rank-2.log").read_text())
    assert said and float(said[1]) > run.summary["run_time_s"]
    assert "server: after the end" in (run.dir / "logs/rank-0.log").read_text()
