"""A preempted run goes on from its last checkpoint: real processes through the CLI,
SIGTERM once checkpoints exist, then the same command with resume=true. The resumed run
ends with exactly the budget's updates, each version once and in order, in one events.jsonl
that is continuous (one start, one resume at the checkpoint, time never going back), with
its evaluations over the whole run; the events cut at the checkpoint are kept apart."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stalebench import experiment
from stalebench.metrics.events import read_events, schema_errors
from tests.conftest import compose
from tests.integration.test_cli import _alive, _pids
from tests.integration.test_signals import start

pytestmark = pytest.mark.slow

BUDGET = 1200
ARGS = [
    "algorithm=ssp",
    "cluster=homogeneous",
    "cluster.num_workers=2",
    "dataset=synthetic",
    "model=mlp",
    "model.hidden=[32]",
    "cluster.compute_ms=5",
    "eval.every_s=0",
    "eval.every_updates=100",
    "logger=none",
    f"budget.max_updates={BUDGET}",
    "checkpoint_every_s=0.5",
]


def checkpoints(run_dir: Path) -> list[dict]:
    return [e for e in read_events(run_dir / "events.jsonl") if e.get("event") == "checkpoint"]


def past_a_checkpoint(run_dir: Path) -> bool:
    """Two checkpoints written, and updates since the last."""
    events = read_events(run_dir / "events.jsonl")
    saved = [e["version"] for e in events if e.get("event") == "checkpoint"]
    last = max((e["version"] for e in events if e["kind"] == "update"), default=0)
    return len(saved) >= 2 and last > saved[-1]


@pytest.mark.timeout(180)
def test_a_run_stopped_mid_way_resumes_from_its_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(tmp_path, run_dir, ARGS)
    try:
        deadline = time.monotonic() + 90
        while not past_a_checkpoint(run_dir) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            time.sleep(0.1)
        first_pids = _pids(run_dir)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    stopped = json.loads((run_dir / "summary.json").read_text())
    assert stopped["status"] == "interrupted" and 0 < stopped["updates"] < BUDGET
    assert checkpoints(run_dir)[-1]["version"] < stopped["updates"]

    again = subprocess.run(
        [sys.executable, "-m", "stalebench.cli", *ARGS, "resume=true", "budget.max_wall_s=120"]
        + ["timeout_s=20", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["updates"] == BUDGET
    events = read_events(run_dir / "events.jsonl")
    assert not [e for e in events if schema_errors(e)]
    assert len(events) == len((run_dir / "events.jsonl").read_text().splitlines())
    system = [e["event"] for e in events if e["kind"] == "system"]
    assert system.count("start") == 1 and system.count("stop") == 0
    (resumed,) = [e for e in events if e.get("event") == "resume"]
    # it goes on from the last checkpoint saved: nothing after it survives the cut
    last_before = [e for e in events[: events.index(resumed)] if e.get("event") == "checkpoint"]
    assert last_before[-1]["version"] == resumed["version"] > 0
    assert resumed["t"] == last_before[-1]["t"]
    versions = [e["version"] for e in events if e["kind"] == "update"]
    assert versions == list(range(1, BUDGET + 1))
    times = [e["t"] for e in events if e["kind"] != "eval"]
    assert times == sorted(times)
    tested = [e["version"] for e in events if e["kind"] == "eval" and e["split"] == "test"]
    assert tested == list(range(0, BUDGET + 1, 100))
    # what the first run did after the checkpoint is kept apart, not lost
    cut = read_events(run_dir / "checkpoint" / f"cut-{resumed['version']}.jsonl")
    assert cut and cut[-1]["event"] == "stop"
    # (none when a checkpoint came between the test's signal and the server's stop)
    lost_updates = [e["version"] for e in cut if e["kind"] == "update"]
    assert lost_updates == list(
        range(resumed["version"] + 1, resumed["version"] + 1 + len(lost_updates))
    )
    assert not [pid for pid in first_pids.values() if _alive(pid)]
    assert not [pid for pid in _pids(run_dir).values() if _alive(pid)]


@pytest.mark.timeout(120)
def test_no_checkpoint_when_the_workers_keep_state(tmp_path):
    # DANA-Slim's momentum lives on the workers, where no checkpoint reaches it: a resume
    # from the server's state alone would train a different algorithm, so none is written
    # (the job the CLI runs, run here: what is checked is the run, not the command line;
    # 100 updates, about 0.25 s, are five times the checkpoints' 0.05 s)
    args = [o for o in ARGS if not o.startswith(("algorithm=", "budget.max_updates"))]
    cfg = compose(
        ["algorithm=dana", "algorithm.update.variant=slim"]
        + [*args, "budget.max_updates=100", "checkpoint_every_s=0.05", "timeout_s=20"]
    )
    cfg.run_dir = str(tmp_path / "run")
    summary = experiment.run(cfg)
    assert summary["status"] == "completed", summary["error"]
    assert not (tmp_path / "run" / "checkpoint").exists()
    assert not checkpoints(tmp_path / "run")
    log = (tmp_path / "run" / "logs" / "rank-0.log").read_text()
    assert "the workers keep state of their own: no checkpoints" in log
