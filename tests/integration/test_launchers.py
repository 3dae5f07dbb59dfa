"""Sweeps through Hydra's other launchers: joblib runs jobs in parallel on one machine, real
multi-process jobs side by side without colliding (each its own directory, store port and
process group); the SLURM launcher (submitit) composes with the settings docs/usage.md shows."""

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
from tests.conftest import compose
from tests.integration.test_cli import FAST, stalebench

pytestmark = pytest.mark.slow

# docs/usage.md's SLURM example, as overrides
SLURM = [
    "hydra/launcher=submitit_slurm",
    "hydra.launcher.partition=gpu",
    "hydra.launcher.timeout_min=240",
    "hydra.launcher.nodes=2",
    "hydra.launcher.tasks_per_node=8",
    "hydra.launcher.gpus_per_node=8",
    "hydra.launcher.cpus_per_task=8",
    "hydra.launcher.mem_gb=256",
    "hydra.launcher.max_num_timeout=3",
    "cluster.num_workers=15",
]


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


def test_the_slurm_launcher_composes_with_the_readme_settings():
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from stalebench.config import register_configs
    from stalebench.plugins import load as load_plugins

    load_plugins()
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module("stalebench.conf", version_base=None):
            cfg = compose("config", overrides=SLURM, return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()
    launcher = cfg.hydra.launcher
    assert (
        launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    )
    assert (launcher.partition, launcher.timeout_min, launcher.cpus_per_task) == ("gpu", 240, 8)
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (2, 8, 8)
    assert (launcher.mem_gb, launcher.max_num_timeout, cfg.cluster.num_workers) == (256, 3, 15)


@pytest.mark.timeout(300)
def test_the_tasks_of_a_submitit_job_form_one_run_or_are_refused_by_name(tmp_path):
    """submitit's local executor, 3 tasks a job (as SLURM's tasks: ranks from its
    environment): the job whose run has 3 ranks is one run of them, its events and summary
    agreeing; the one whose run has 2 is refused by name on every task, recorded `invalid`,
    and never runs twice into its directory."""
    done = stalebench(
        ["-m", "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=3"]
        + ["hydra.sweep.dir=sweep", "algorithm=ssp", "cluster.num_workers=2,1", *FAST[:-1]]
        + ["budget.max_updates=40", "logger=none"],
        tmp_path,
        timeout=280,
    )
    sweep = tmp_path / "sweep"
    ran, refused = (json.loads((sweep / j / "summary.json").read_text()) for j in ("0", "1"))
    assert (ran["status"], ran["updates"], ran["num_workers"]) == ("completed", 40, 2), done.stderr
    assert [r["rank"] for r in ran["ranks"]] == [0, 1, 2]
    events = [json.loads(line) for line in (sweep / "0" / "events.jsonl").read_text().splitlines()]
    assert sum(e["kind"] == "update" for e in events) == 40
    assert sum(e["kind"] == "system" and e["event"] == "start" for e in events) == 1
    said = ("the launch starts 3 processes, but engine=ps with cluster.num_workers=1 runs 2: "
            "set hydra.launcher.tasks_per_node × hydra.launcher.nodes to 2")  # fmt: skip
    assert (refused["status"], refused["error"]) == ("invalid", said)
    task_logs = sorted((sweep / ".submitit").glob("*/*_log.err"))
    told = [p for p in task_logs if f"stalebench: error: {said}" in p.read_text()]
    assert len(told) == 3  # every task of that job


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
            "budget.max_updates=3000", "checkpoint_every_s=1", "eval.every_updates=500",
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
    assert (summary["status"], summary["updates"]) == ("completed", 3000), err[-3000:]
    events = read_events(run_dir / "events.jsonl")
    assert [e["event"] for e in events if e["kind"] == "system" and e["event"] == "resume"] == [
        "resume"
    ]  # the requeued job went on from a checkpoint, once
    assert (run_dir / ".requeued").exists()
    cfg = compose(args)
    cfg.run_dir = str(tmp_path / "uninterrupted")
    assert experiment.run(cfg)["status"] == "completed"
    ours, reference = (torch.load(d / "model.pt") for d in (run_dir, Path(cfg.run_dir)))
    assert ours.keys() == reference.keys()
    assert all(torch.equal(ours[k], reference[k]) for k in ours)
