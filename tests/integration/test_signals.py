"""SIGINT and SIGTERM to `stalebench` (what Ctrl-C, SLURM and Kubernetes send) stop every
process of the run within seconds, write summary.json with status `interrupted`, end
events.jsonl with a `stop` event, print one line (no traceback) and exit with 128 + the
signal; a SIGKILL of the top process stops its ranks at once. Real processes, through the
CLI, for the parameter server, the pipeline and the local-update engine."""

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

from stalebench.metrics.events import read_events, schema_errors
from tests.integration.test_cli import FAST, _alive, _pids
from tests.unit.test_pipeline_rules import SMALL

pytestmark = pytest.mark.slow

PS = ["algorithm=ssp", "cluster.num_workers=2", *FAST[:-1]]
# the pipeline rules' small transformer, in real processes
PIPELINE = ["algorithm=gpipe", *(o for o in SMALL if o not in ("runtime=sim", "logger=none"))]
LOCAL = ["algorithm=diloco", "cluster.num_workers=2", *FAST[:-1]]


def start(tmp_path: Path, run_dir: Path, args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "stalebench.cli", *args, "budget.max_wall_s=120", "timeout_s=20"]
        + [f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a shell job has
    )


def wait_for_updates(proc: subprocess.Popen, run_dir: Path, world: int) -> dict[int, int]:
    """The ranks' pids, once all of them run and updates are recorded."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        pids = _pids(run_dir) if (run_dir / "logs").exists() else {}
        updates = [e for e in read_events(run_dir / "events.jsonl") if e["kind"] == "update"]
        if len(pids) == world and len(updates) > 5:
            return pids
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"the run did not start: {proc.communicate()[1][-2000:]}")


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "args, world, sig, to_group",
    [
        (PS, 3, signal.SIGTERM, False),  # a scheduler signals the job's top process
        (PS, 3, signal.SIGINT, True),  # Ctrl-C reaches the whole foreground group
        (PIPELINE, 4, signal.SIGTERM, False),
        (LOCAL, 2, signal.SIGINT, True),
    ],
    ids=["ps-SIGTERM", "ps-SIGINT", "pipeline-SIGTERM", "local-SIGINT"],
)
def test_a_signal_stops_every_rank_and_records_interrupted(tmp_path, args, world, sig, to_group):
    run_dir = tmp_path / "run"
    proc = start(tmp_path, run_dir, args)
    try:
        pids = wait_for_updates(proc, run_dir, world)
        sent = time.monotonic()
        os.killpg(proc.pid, sig) if to_group else proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, (proc.returncode, err[-2000:])
    assert "Traceback" not in err and "Traceback" not in out, err[-3000:]
    assert out.startswith("[interrupted] ") and f"error: interrupted by {sig.name}" in out, out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["error"] == f"interrupted by {sig.name}"
    events = read_events(run_dir / "events.jsonl")
    # what was trained up to the signal is kept
    assert summary["updates"] == max(e["version"] for e in events if e["kind"] == "update") > 0
    assert not [e for e in events if schema_errors(e)]
    assert len(events) == len((run_dir / "events.jsonl").read_text().splitlines())  # none torn
    assert events[-1] == {
        "kind": "system",
        "t": max(e["t"] for e in events),
        "event": "stop",
        "status": "interrupted",
        "reason": f"interrupted by {sig.name}",
    }
    assert took < 15, took
    assert not [r for r, pid in pids.items() if _alive(pid)]


def _written(run_dir: Path) -> dict[str, tuple[int, int]]:
    """Every file of the run directory: its size and modification time."""
    out = {}
    for path in run_dir.rglob("*"):
        with contextlib.suppress(OSError):  # a checkpoint replaced meanwhile
            if path.is_file():
                st = path.stat()
                out[str(path.relative_to(run_dir))] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.timeout(120)
def test_a_killed_supervisor_stops_its_ranks_at_once(tmp_path):
    """SIGKILL of the process that supervises a run (the top process here, a loky worker
    in a joblib multirun): no handler runs in it, yet its ranks stop within a second and
    write nothing more to the run directory, which a scheduler restarting the run with
    resume=true may already be reading. (The ranks' parent is the fork server, which takes
    0.6 s to end on an idle machine, seconds on a busy one: its death is not soon enough.)"""
    run_dir = tmp_path / "run"
    # checkpoints every 0.2 s as well as events: a rank left running writes both
    proc = start(tmp_path, run_dir, [*PS, "checkpoint_every_s=0.2"])
    try:
        pids = wait_for_updates(proc, run_dir, 3)
        proc.kill()  # SIGKILL: no handler runs in the top process
        killed = time.monotonic()
        gone_after, written = None, None  # written: the run directory 0.3 s after the kill
        while (gone_after is None or written is None) and time.monotonic() < killed + 10:
            now = time.monotonic() - killed
            if gone_after is None and not [pid for pid in pids.values() if _alive(pid)]:
                gone_after = now
            if written is None and now >= 0.3:
                written = _written(run_dir)
            time.sleep(0.01)
        time.sleep(1)
        assert _written(run_dir) == written, "the run directory changed after 0.3 s"
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not [r for r, pid in pids.items() if _alive(pid)]
    assert gone_after < 1, gone_after
