"""Two torchrun "nodes" on loopback (c10d rendezvous, 2 processes each): the server is rank
0 on the node started with STALEBENCH_RUN_DIR_NODE=1, whatever rank the rendezvous gave
it; losing either node ends the run with a summary.json, written by the node that
survives, and leaves no process (a lost node's ranks die with its agent)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stalebench.metrics.events import read_events
from tests.conftest import free_port
from tests.integration.test_cli import FAST, _alive, _pids

pytestmark = pytest.mark.slow

ARGS = ["algorithm=ssp", "cluster.num_workers=3", *FAST[:-1], "budget.max_wall_s=60"]
ARGS += ["timeout_s=5", "logger=none"]


def node(tmp_path: Path, name: str, owner: bool, port: int, run_dir: Path) -> subprocess.Popen:
    (tmp_path / name).mkdir()
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2"]
        + ["--nproc-per-node", "2", "--rdzv-backend", "c10d"]
        + [f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={tmp_path.name}"]
        + ["-m", "stalebench.cli", *ARGS, f"hydra.run.dir={run_dir}"],
        cwd=tmp_path / name,
        env={**os.environ, "STALEBENCH_RUN_DIR_NODE": "1" if owner else "0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def started(run_dir: Path, nodes: list[subprocess.Popen]) -> dict[int, int]:
    """The ranks' pids, once all four train."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert all(n.poll() is None for n in nodes), [n.communicate()[1][-2000:] for n in nodes]
        pids = _pids(run_dir) if (run_dir / "logs").exists() else {}
        updates = [e for e in read_events(run_dir / "events.jsonl") if e["kind"] == "update"]
        if len(pids) == 4 and len(updates) > 20:
            return pids
        time.sleep(0.2)
    pytest.fail("the run did not start")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("lost", ["other", "owner"])
def test_a_lost_node_ends_the_run_with_a_summary_from_the_survivor(tmp_path, lost):
    run_dir = tmp_path / "owner" / "run"
    port = free_port()
    other = node(tmp_path, "other", False, port, tmp_path / "other" / "run")
    time.sleep(1)  # the other node usually joins first: the rendezvous gives it rank 0
    owner = node(tmp_path, "owner", True, port, run_dir)
    nodes = {"owner": owner, "other": other}
    try:
        pids = started(run_dir, list(nodes.values()))
        # rank 0 (the server) runs on the owner node: its agent's child
        assert int(Path(f"/proc/{pids[0]}/stat").read_text().split()[3]) == owner.pid
        os.kill(nodes[lost].pid, signal.SIGKILL)  # the node's agent; its ranks die with it
        survivor = nodes["other" if lost == "owner" else "owner"]
        _, err = survivor.communicate(timeout=120)
    finally:
        for n in nodes.values():
            if n.poll() is None:
                n.kill()
    assert not (tmp_path / "other" / "run").exists()  # the other node made no directory
    assert (run_dir / "summary.json").exists(), err[-6000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["updates"] > 20
    if lost == "other":  # the server saw a worker go; or the owner's torchrun agent, seeing
        # the other node leave, stopped its ranks first (SIGTERM): interrupted, still written
        assert summary["status"] in ("failed", "interrupted"), summary
        if summary["status"] == "failed":
            assert "(rank " in summary["error"] and " lost" in summary["error"], summary["error"]
    else:  # the other node's ranks lost the server and wrote the summary
        assert summary["status"] == "failed"
        assert summary["error"].startswith(
            "server (rank 0) ended without a summary (its node lost?); here: server (rank 0) lost"
        ), summary["error"]
        events = read_events(run_dir / "events.jsonl")
        assert events[-1]["event"] == "stop" and events[-1]["status"] == "failed"
    deadline = time.monotonic() + 10
    while [p for p in pids.values() if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [r for r, p in pids.items() if _alive(p)]
