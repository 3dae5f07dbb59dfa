"""Defects found when the engines were read, each kept fixed by a test: the allreduce
engine applies the cluster's faults, a bad trace file is refused before any process
starts (every malformed kind: tests/unit/test_validation_paths.py), and a torchrun run
whose rank 0 fails still ends with a summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import free_port, run_job


@pytest.mark.timeout(120)
def test_allreduce_pauses_on_a_fault_and_reports_it(tmp_path):
    run = run_job(
        tmp_path,
        [
            "engine=allreduce",
            "algorithm=bsp",
            "cluster.num_workers=2",
            "budget.max_updates=30",
            "cluster.faults=[{worker:1,at_s:0.0,duration_s:0.5}]",
        ],
    )
    assert run.summary["status"] == "completed"
    (pause,) = [e for e in run.events if e["kind"] == "worker" and e["event"] == "pause"]
    assert (pause["worker"], pause["duration_s"]) == (1, 0.5)
    first = min(e["t"] for e in run.events if e["kind"] == "update")
    assert first >= 0.5  # the round waited for the paused replica


@pytest.mark.timeout(120)
def test_allreduce_fails_when_a_fault_kills_a_replica(tmp_path):
    run = run_job(
        tmp_path,
        [
            "engine=allreduce",
            "algorithm=bsp",
            "cluster.num_workers=2",
            "budget.max_updates=400",
            "budget.max_wall_s=0",
            "timeout_s=10",
            "cluster.faults=[{worker:1,at_s:0.2,action:die}]",
        ],
    )
    assert run.summary["status"] == "failed"
    assert "worker 1 (rank 1)" in run.summary["error"]
    assert "fault injected by cluster.faults" in run.summary["error"]


def test_the_cli_refuses_a_missing_trace_file_in_one_line(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "stalebench.cli", "cluster.compute=trace",
         f"cluster.trace_file={tmp_path / 'none.csv'}", f"run_dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.startswith("stalebench: error: cluster.trace_file:")
    assert "Traceback" not in out.stderr


@pytest.mark.timeout(120)
def test_torchrun_rank0_failing_before_its_summary_is_reported(tmp_path):
    """Under torchrun (RANK, WORLD_SIZE in the environment) the CLI itself is rank 0: when
    it fails before writing summary.json, the CLI writes one (status failed, the reason)
    and exits non-zero, instead of dying on the missing file."""
    env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "stalebench.cli", "engine=allreduce", "algorithm=bsp",
         "cluster.num_workers=1", "dataset=synthetic", "model=mlp", "logger=none",
         "cluster.faults=[{worker:0,at_s:0.0,action:die}]", f"run_dir={run_dir}"],
        capture_output=True, text=True, timeout=100, env=env,
    )  # fmt: skip
    assert "FileNotFoundError" not in out.stderr
    assert out.returncode != 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert "worker 0 (rank 0) exited with code 3" in summary["error"]
