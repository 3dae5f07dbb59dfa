"""SIGTERM to a multirun of Hydra's joblib launcher, as SLURM's scancel sends it (to the
job's top process, or to its whole process group): every job under way stops and is
recorded `interrupted` (summary.json with the reason, events.jsonl kept), a job still
queued is not started, the top process exits with 128 + 15, and no process of the session
is left (loky's workers and resource trackers, the runs' fork servers and ranks) within
seconds. Real runs, two at once."""

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

from stalebench.metrics.events import read_events
from tests.integration.test_cli import FAST, _pids

pytestmark = pytest.mark.slow

# three jobs on two loky workers: two under way when the signal comes, one queued
SWEEP = ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.sweep.dir=sweep"]
JOBS = ["algorithm=asp,ssp,bsp", "cluster.num_workers=2", *FAST[:-1], "budget.max_wall_s=120"]


def _session(sid: int) -> list[int]:
    """The live processes (not zombies) of session `sid`: the top process started its own,
    and everything it starts stays in it."""
    out = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if proc.name.isdigit() and int(fields[3]) == sid and fields[0] != "Z":
                out.append(int(proc.name))
    return out


def _updates(run_dir: Path) -> int:
    return sum(e["kind"] == "update" for e in read_events(run_dir / "events.jsonl"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("to_group", [False, True], ids=["top-process", "process-group"])
def test_sigterm_stops_a_joblib_multirun_and_leaves_no_process(tmp_path, to_group):
    sweep = tmp_path / "sweep"
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stalebench.cli", *SWEEP, *JOBS, "timeout_s=20"],
            cwd=tmp_path,
            stdout=out,  # files: a process left behind must not hold the test's pipes
            stderr=err,
            start_new_session=True,  # its own session and process group, as a batch job has
        )
    try:
        running = [sweep / "0", sweep / "1"]
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and proc.poll() is None:
            ranks = [_pids(d) if (d / "logs").exists() else {} for d in running]
            if all(len(r) == 3 for r in ranks) and all(_updates(d) > 5 for d in running):
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"the jobs did not start: {(tmp_path / 'err').read_text()[-3000:]}")
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM) if to_group else proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        while _session(proc.pid) and time.monotonic() < sent + 60:
            time.sleep(0.1)
        took = time.monotonic() - sent
        left = _session(proc.pid)
    finally:
        for pid in _session(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
    err = (tmp_path / "err").read_text()
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, err[-3000:])
    assert "Traceback" not in err, err[-3000:]
    assert not left, f"{len(left)} processes left {took:.1f} s after the signal"
    assert took < 20, took
    for run_dir in running:
        summary = json.loads((run_dir / "summary.json").read_text())
        assert (summary["status"], summary["error"]) == ("interrupted", "interrupted by SIGTERM")
        events = read_events(run_dir / "events.jsonl")
        assert summary["updates"] == max(e["version"] for e in events if e["kind"] == "update")
        assert events[-1]["event"] == "stop" and events[-1]["status"] == "interrupted"
    # the queued job never started: no run of it anywhere
    assert not list(sweep.glob("2/*.jsonl")) and not (sweep / "2" / "summary.json").exists()
