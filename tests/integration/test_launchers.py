"""Sweeps through Hydra's other launchers: joblib runs jobs in parallel on one machine, real
multi-process jobs side by side without colliding (each its own directory, store port and
process group); a submitit job signalled as SLURM does before a time limit is requeued and
resumes. (docs/clusters.md's commands: test_clusters_page.py.)"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from stalebench import experiment
from stalebench.metrics.events import read_events
from tests.conftest import compose, processes_left
from tests.integration.test_cli import FAST, stalebench

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_a_parallel_joblib_sweep_of_real_runs_never_collides(tmp_path):
    done = stalebench(
        ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.sweep.dir=sweep"]
        + ["algorithm=asp,ssp", "seed=0", "cluster.num_workers=2", *FAST[:-1]]
        + ["budget.max_updates=60", "logger=none"],
        tmp_path,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summaries = [
        json.loads(p.read_text()) for p in sorted((tmp_path / "sweep").glob("*/summary.json"))
    ]
    assert [(s["status"], s["updates"]) for s in summaries] == [("completed", 60)] * 2
    assert sorted((s["algorithm"], s["seed"]) for s in summaries) == [("asp", 0), ("ssp", 0)]
    assert "Runs: 2 (2 completed)" in (tmp_path / "sweep" / "report.md").read_text()


def submitit_tasks(folder: Path) -> list[int]:
    """The pids of the submitit tasks whose job folder is under `folder`."""
    pids = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes()
            if b"submitit.core._submit" in cmdline and str(folder).encode() in cmdline:
                pids.append(int(proc.name))
    return pids


@pytest.mark.timeout(300)
def test_a_submitit_job_signalled_as_at_its_time_limit_is_requeued_and_resumes(tmp_path):
    """SIGUSR2 to a submitit job's task, as SLURM sends before a time limit or preemption
    (submitit's local executor here): the run ends `interrupted` at once, submitit requeues
    the job, and the requeued job resumes the run from its last checkpoint: `completed`,
    with the θ of the same run never interrupted (the simulator: bit for bit)."""
    args = ["runtime=sim", "engine=allreduce", "algorithm=bsp", "cluster.num_workers=2",
            "budget.max_updates=1200", "checkpoint_every_s=1", "eval.every_updates=300",
            *[a for a in FAST if not a.startswith("eval.every_updates")],
            "logger=none"]  # fmt: skip
    top = subprocess.Popen(
        [sys.executable, "-m", "stalebench.cli", "-m", "hydra/launcher=submitit_local",
         "hydra.sweep.dir=sweep", *args],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    run_dir = tmp_path / "sweep" / "0"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and top.poll() is None:
            events = read_events(run_dir / "events.jsonl") if run_dir.exists() else []
            if sum(e["kind"] == "update" for e in events) >= 300:
                break
            time.sleep(0.05)
        (task,) = submitit_tasks(tmp_path / "sweep")
        os.kill(task, signal.SIGUSR2)
        _, err = top.communicate(timeout=240)
    finally:
        if top.poll() is None:
            top.kill()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["updates"]) == ("completed", 1200), err[-3000:]
    events = read_events(run_dir / "events.jsonl")
    assert [e["event"] for e in events if e["kind"] == "system" and e["event"] == "resume"] == [
        "resume"
    ]  # the requeued job went on from a checkpoint, once
    assert (run_dir / ".requeued").exists()
    assert not processes_left(tmp_path)
    cfg = compose(args)
    cfg.run_dir = str(tmp_path / "uninterrupted")
    assert experiment.run(cfg)["status"] == "completed"
    ours, reference = (torch.load(d / "model.pt") for d in (run_dir, Path(cfg.run_dir)))
    assert ours.keys() == reference.keys()
    assert all(torch.equal(ours[k], reference[k]) for k in ours)
