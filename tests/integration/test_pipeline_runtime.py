"""The pipeline engine's real runtime: one process per stage over gloo. Every preset runs 4
stages to completion with falling validation loss; the real pipeline and the simulator give
the same loss at every step; a dead stage fails the run with its name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from stalebench import experiment
from stalebench.metrics.events import read_events, schema_errors
from tests.conftest import SUMMARY_FIELDS, compose
from tests.integration.test_cli import _alive, torchrun
from tests.integration.test_worker_loss import kill_mid_run
from tests.speed_helpers import fork_server_for_every_engine
from tests.unit.test_pipeline_rules import SMALL, losses

REAL = [o for o in SMALL if o != "runtime=sim"] + ["timeout_s=30", "num_threads=1"]
UPDATES = 40  # of a real run that learns, and of a real and a simulated run compared


@pytest.fixture(scope="module", autouse=True)
def one_fork_server():
    """The ranks of every real run here (the torchrun's apart) forked from one server,
    loaded for every engine (one started before in this process may serve them already)."""
    fork_server_for_every_engine()


def run(run_dir: Path, *overrides: str) -> tuple[dict, list[dict]]:
    cfg = compose([*REAL, *overrides])
    cfg.run_dir = str(run_dir)
    summary = experiment.run(cfg)
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    return summary, read_events(run_dir / "events.jsonl")


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """real_run(*overrides): the real run of UPDATES updates on those overrides, run once
    for every test that reads it (a preset's run learns, and matches the simulator's):
    its summary, events and run directory."""
    runs: dict[tuple[str, ...], tuple[dict, list[dict], Path]] = {}

    def get(*overrides: str) -> tuple[dict, list[dict], Path]:
        if overrides not in runs:
            run_dir = tmp_path_factory.mktemp("real")
            runs[overrides] = (*run(run_dir, *overrides, f"budget.max_updates={UPDATES}"), run_dir)
        return runs[overrides]

    return get


@pytest.mark.timeout(120)
@pytest.mark.parametrize("preset", ["nesterov_pp", "pipedream", "gpipe"])
def test_four_stage_real_run_of_each_preset_completes_and_learns(real_run, preset):
    summary, events, run_dir = real_run(f"algorithm={preset}")
    assert summary["status"] == "completed", summary["error"]
    assert SUMMARY_FIELDS <= set(summary)
    assert summary["updates"] == 40 and summary["num_workers"] == 4
    assert summary["algorithm"] == preset and summary["engine"] == "pipeline"
    assert summary["bytes_sent"] > 0
    assert not [e for e in events if schema_errors(e)]
    for k in range(4):  # every stage applied every update, each with its delay
        ups = [e for e in events if e["kind"] == "update" and e["worker"] == k]
        assert [e["version"] for e in ups] == list(range(1, 41))
    vals = sorted(
        (e for e in events if e["kind"] == "eval" and e["split"] == "test"),
        key=lambda e: e["version"],
    )
    assert [e["version"] for e in vals] == [0, 10, 20, 30, 40]
    assert vals[-1]["loss"] < vals[0]["loss"] - 0.3, (vals[0], vals[-1])
    logs = sorted(p.name for p in (run_dir / "logs").glob("rank-*.log"))
    assert len(logs) == 4


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm=nesterov_pp"],
        ["algorithm=pipedream", "algorithm.pipeline.weight_stashing=false"],
        ["algorithm=gpipe"],
    ],
    ids=["nadamw-stashing", "adamw-no-stashing", "gpipe"],
)
def test_real_and_sim_agree_step_for_step(tmp_path, real_run, overrides):
    real, real_events, _ = real_run(*overrides)  # the preset's run that learns, if it is one
    sim, sim_events = run(tmp_path, *overrides, f"budget.max_updates={UPDATES}", "runtime=sim")
    assert real["status"] == sim["status"] == "completed"
    for k in range(4):
        assert losses(real_events, k) == pytest.approx(losses(sim_events, k), rel=1e-5)
        assert gaps(real_events, k) == pytest.approx(gaps(sim_events, k), rel=1e-4, abs=1e-7)
    assert real["final"]["loss"] == pytest.approx(sim["final"]["loss"], rel=1e-5)


def gaps(events: list[dict], stage: int) -> list[float]:
    return [e["weight_gap"] for e in events if e["kind"] == "update" and e["worker"] == stage]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("runtime", ["real", "sim"])
def test_a_wall_clock_budget_stops_every_stage_at_the_same_update(tmp_path, runtime):
    # one program in both runtimes: stage 0 stops feeding once the budget is spent, and
    # every stage drains what it holds (in the simulator on its own virtual clock)
    summary, events = run(
        tmp_path,
        "algorithm=pipedream",
        "budget.max_updates=0",
        "budget.max_wall_s=2",  # 60 updates or more (30 at a load of 13 on 2 cores)
        f"runtime={runtime}",
    )
    assert summary["status"] == "completed", summary["error"]
    last = [
        max(e["version"] for e in events if e["kind"] == "update" and e["worker"] == k)
        for k in range(4)
    ]
    assert len(set(last)) == 1 and last[0] > 10


@pytest.mark.timeout(120)
def test_a_killed_stage_fails_the_run_and_leaves_no_process(tmp_path):
    run_dir = tmp_path / "run"
    args = ["algorithm=pipedream", *REAL, "budget.max_updates=100000", "timeout_s=10"]
    summary, pids, ended_after = kill_mid_run(run_dir, args, world=4, rank=2)  # run here
    assert summary["status"] == "failed"
    assert "stage 2 (rank 2)" in summary["error"], summary["error"]
    assert ended_after < 30, ended_after
    assert not [r for r, pid in pids.items() if _alive(pid)]
    assert [e for e in read_events(run_dir / "events.jsonl") if e["kind"] == "update"]


@pytest.mark.timeout(120)
def test_torchrun_starts_a_pipeline(tmp_path):
    args = ["algorithm=pipedream", "algorithm.pipeline.stages=2", "budget.max_updates=20"]
    torchrun(tmp_path, 2, args + [o for o in REAL if not o.startswith("num_threads")])
    (path,) = list(tmp_path.rglob("summary.json"))
    summary = json.loads(path.read_text())
    assert summary["status"] == "completed" and summary["updates"] == 20
    assert summary["num_workers"] == 2 and summary["stage_delay"] == [1, 0]


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_stages_compute_on_cuda_and_match_cpu(tmp_path):
    common = ["algorithm=nesterov_pp", "budget.max_updates=15"]
    cpu, cpu_events = run(tmp_path / "cpu", *common, "device=cpu")
    gpu, gpu_events = run(tmp_path / "gpu", *common, "device=cuda")
    assert cpu["status"] == gpu["status"] == "completed"
    assert losses(gpu_events, 3) == pytest.approx(losses(cpu_events, 3), rel=1e-3)
