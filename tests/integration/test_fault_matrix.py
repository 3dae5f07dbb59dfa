"""The fault matrix: every real engine × barrier family (and the serverless engines with
rounds over the replicas left) × {worker killed, worker stopped past the timeout, server
(rank 0) killed, NaN, SIGINT, SIGTERM, a worker's sends slowed, SIGTERM then resume=true}.
Each cell runs `stalebench` with real processes and checks that the run ends in its
documented status within its timeout, with the exit code of that status, no process left
(by pid), and events.jsonl whole up to its `end` (or the supervisor's `stop`) event; a
resumed run goes on from its last checkpoint where its engine keeps them.

Then the targeted collective-kill cells (`test_two_kills_inside_a_collective`): for
engine=allreduce and engine=local's DiLoCo with `cluster.min_replicas`, a replica killed
10-90 ms into a 16 MB all-reduce (or in its tail, once it has sent 80-100 % of its part)
and another in quick succession, 20 tries each (drawn per try; `STALEBENCH_TWO_KILLS=<n>`
for another count): every try completes over the survivors or fails naming every replica
killed (test_quorum.two_kills, `verdict`).

88 + 80 runs of several seconds: outside CI (the cells CI needs are in test_signals,
test_worker_loss, test_cli and test_quorum). Run it with

    STALEBENCH_FAULT_MATRIX=results.jsonl python -m pytest tests/integration/test_fault_matrix.py

which also writes each cell's outcome and seconds, one JSON line per cell, to results.jsonl
(`-k two_kills` for the collective-kill cells alone).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from stalebench.metrics.events import read_events
from stalebench.metrics.summary import EXIT_CODES
from tests.conftest import compose
from tests.integration.test_cli import FAST, _alive, _pids
from tests.integration.test_quorum import PROBE_ENGINES, two_kills
from tests.integration.test_signals import wait_for_updates
from tests.unit.test_pipeline_rules import SMALL

OUT = os.environ.get("STALEBENCH_FAULT_MATRIX")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not OUT, reason="the fault matrix runs with STALEBENCH_FAULT_MATRIX=<file>"),
]

DATA = [*FAST[:-1], "cluster.num_workers=2"]
QUORUM = [*FAST[:-1], "cluster.num_workers=3", "cluster.min_replicas=2"]
PIPE = [o for o in SMALL if o not in ("runtime=sim", "logger=none")]
UPDATE, INNER, OPT = (
    "algorithm.update.lr=1e12",
    "algorithm.inner.lr=1e12",
    "algorithm.optimizer.lr=1e12",
)
# family: (overrides, the override that makes it diverge, a worker's rank, loses a worker?)
FAMILIES = {
    "ps/waiting (ssp)": (["algorithm=ssp", *DATA], UPDATE, 2, False),
    "ps/barrier-free (asp)": (["algorithm=asp", *DATA], UPDATE, 2, True),
    "allreduce (bsp)": (["algorithm=bsp", "engine=allreduce", *DATA], UPDATE, 1, False),
    "local/sync (diloco)": (["algorithm=diloco", *DATA], INNER, 1, False),
    "local/async (async_diloco)": (["algorithm=async_diloco", *DATA], INNER, 2, True),
    # three replicas, rounds going on over two once one is lost (cluster.min_replicas)
    "allreduce/quorum (bsp)": (["algorithm=bsp", "engine=allreduce", *QUORUM], UPDATE, 1, True),
    "local/sync quorum (diloco)": (["algorithm=diloco", *QUORUM], INNER, 1, True),
    # fragments merged 5 inner steps after their send: the exchanges run meanwhile
    "local/streaming quorum (streaming_diloco)": (
        ["algorithm=streaming_diloco", *QUORUM],
        INNER,
        1,
        True,
    ),
    "gossip/quorum (dpsgd)": (["algorithm=dpsgd", *QUORUM], INNER, 1, True),
    "gossip (dpsgd)": (["algorithm=dpsgd", *DATA], INNER, 1, False),
    "pipeline/sync (gpipe)": (["algorithm=gpipe", *PIPE], OPT, 1, False),
    "pipeline/async (pipedream)": (["algorithm=pipedream", *PIPE], OPT, 1, False),
}
FAULTS = ["worker killed", "worker stopped", "server killed", "NaN", "SIGINT", "SIGTERM",
          "sends slowed", "resumed after SIGTERM"]  # fmt: skip
SLOW = "cluster.faults=[{worker:1,at_step:5,action:slow,delay_ms:20}]"
TIMEOUT_S = 5


def expected(fault: str, survives: bool) -> str:
    if fault in ("SIGINT", "SIGTERM"):
        return "interrupted"
    if fault == "NaN":
        return "diverged"
    if fault in ("sends slowed", "resumed after SIGTERM"):
        return "completed"
    if fault.startswith("worker") and survives:
        return "completed"
    return "failed"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fault_matrix(tmp_path, family, fault):
    args, nan, worker_rank, survives = FAMILIES[family]
    world = _world(args)
    if fault == "sends slowed" and "faults" in _engine(args).ignores:
        pytest.skip(
            f"engine={_engine(args).name} refuses cluster.faults by name before any process"
        )
    run_dir = tmp_path / "run"
    # a run that goes on without the worker, with slowed sends, or resumed ends by its wall
    # budget
    ends_by_wall = (survives and fault.startswith("worker")) or fault in FAULTS[-2:]
    wall = 10 if ends_by_wall else 120
    extra = {"NaN": [nan], "sends slowed": [SLOW]}.get(fault, [])
    keeps = fault == "resumed after SIGTERM" and not _why_no_checkpoints(args)
    extra += ["checkpoint_every_s=0.5"] if keeps else []

    def start() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "stalebench.cli", *args, *extra, f"budget.max_wall_s={wall}"]
            + [f"timeout_s={TIMEOUT_S}", f"hydra.run.dir={run_dir}"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group, as a shell job has
        )

    proc = start()
    began = time.monotonic()
    try:
        pids = wait_for_updates(proc, run_dir, world) if fault != "NaN" else {}
        while keeps and not (run_dir / "checkpoint" / "state.pt").exists():
            assert proc.poll() is None and time.monotonic() < began + 60, "no checkpoint"
            time.sleep(0.05)
        acted = time.monotonic()
        if fault == "worker killed":
            os.kill(pids[worker_rank], signal.SIGKILL)
        elif fault == "worker stopped":
            os.kill(pids[worker_rank], signal.SIGSTOP)
        elif fault == "server killed":
            os.kill(pids[0], signal.SIGKILL)
        elif fault == "SIGINT":
            os.killpg(proc.pid, signal.SIGINT)
        elif fault in ("SIGTERM", "resumed after SIGTERM"):
            proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=180)
        if fault == "resumed after SIGTERM":
            assert proc.returncode == 128 + signal.SIGTERM
            first = pids
            extra.append("resume=true")
            proc = start()
            proc.communicate(timeout=180)
            pids = {**{r + 1000: p for r, p in first.items()}, **_pids(run_dir)}
        took = time.monotonic() - (acted if fault != "NaN" else began)
        pids = pids or _pids(run_dir)
    finally:
        if proc.poll() is None:
            proc.kill()
    summary = json.loads((run_dir / "summary.json").read_text())
    events = read_events(run_dir / "events.jsonl")
    left = [r for r, pid in pids.items() if _alive(pid)]
    for pid in pids.values():  # a stopped rank left behind is not left for the next cell
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    row = {
        "family": family,
        "fault": fault,
        "expected": expected(fault, survives),
        "status": summary["status"],
        "exit": proc.returncode,
        "seconds": round(took, 1),
        "left": left,
        "error": (summary["error"] or "")[:160],
        "workers_lost": summary.get("workers_lost"),
        "resumed": [e["version"] for e in events if e.get("event") == "resume"],
    }
    with open(OUT, "a") as f:
        f.write(json.dumps(row) + "\n")

    status = expected(fault, survives)
    assert summary["status"] == status, row
    code = 128 + getattr(signal, fault) if status == "interrupted" else EXIT_CODES[status]
    assert proc.returncode == code, row
    assert not left, row
    if status == "failed":  # a clear reason: the rank lost, or what a collective can say
        assert "(rank " in summary["error"] or "a peer died" in summary["error"], row
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    assert len(events) == len(lines), row  # no torn line
    ends = [i for i, e in enumerate(events) if e.get("event") in ("end", "stop")]
    assert ends and all(e["kind"] == "eval" for e in events[ends[-1] + 1 :]), row
    assert took < 20 + 2 * TIMEOUT_S + (wall if wall < 120 else 0), row
    resumed = [e for e in events if e.get("event") == "resume"]
    assert len(resumed) == (1 if keeps else 0), row
    if fault == "sends slowed":
        assert summary["updates"] > 0, row


TWO_KILLS = int(os.environ.get("STALEBENCH_TWO_KILLS", "20"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("attempt", range(TWO_KILLS))
@pytest.mark.parametrize("at", ["10-90 ms", "tail"])
@pytest.mark.parametrize("engine", list(PROBE_ENGINES))
def test_two_kills_inside_a_collective(tmp_path, engine, at, attempt):
    row = two_kills(tmp_path, engine, attempt, at)
    with open(OUT, "a") as f:
        f.write(json.dumps({"family": f"{engine}/quorum", "fault": "two kills", **row}) + "\n")
    assert row["verdict"] != "bad", row


def _engine(args: list[str]):
    from stalebench.experiment import engine_of

    return engine_of(compose(args))


def _why_no_checkpoints(args: list[str]) -> str | None:
    return _engine(args).why_no_checkpoints()


def _world(args: list[str]) -> int:
    return _engine(args).world_size()
