"""Two torchrun "nodes" on loopback (c10d rendezvous, 2 processes each): the server is rank
0 on the node started with STALEBENCH_RUN_DIR_NODE=1, whatever rank the rendezvous gave
it; losing either node ends the run with a summary.json, written by the node that
survives, and leaves no process (a lost node's ranks die with its agent); input refused on
one node ends every node's processes within seconds, each with the same line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from stalebench.metrics.events import read_events
from stalebench.runtime.nodes import own_log_dir
from tests.conftest import free_port, processes_left
from tests.integration.test_cli import FAST, _alive
from tests.unit.test_data import write_mnist

pytestmark = pytest.mark.slow

ARGS = ["algorithm=ssp", "cluster.num_workers=3", *FAST[:-1], "budget.max_wall_s=60"]
ARGS += ["timeout_s=5", "logger=none"]


def node(
    tmp_path: Path, name: str, owner: bool, port: int, run_dir: Path, args: list[str] = ARGS
) -> subprocess.Popen:
    (tmp_path / name).mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2"]
        + ["--nproc-per-node", "2", "--rdzv-backend", "c10d"]
        + [f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={tmp_path.name}"]
        + ["-m", "stalebench.cli", *args, f"hydra.run.dir={run_dir}"],
        cwd=tmp_path / name,
        env={**os.environ, "STALEBENCH_RUN_DIR_NODE": "1" if owner else "0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def rank_pids(run_dir: Path) -> dict[int, int]:
    """Each rank's pid, from its log: the owner's in the run directory, the other node's
    in that node's own directory (`own_log_dir`: it need not share the owner's disk)."""
    pids = {}
    for logs in (run_dir / "logs", own_log_dir(run_dir)):
        for log in logs.glob("rank-*.log"):
            for line in log.read_text().splitlines():
                if "process group ready" in line:
                    pids[int(log.stem.split("-")[1])] = int(line.split("(pid ")[1].split(")")[0])
    return pids


def started(run_dir: Path, nodes: list[subprocess.Popen]) -> dict[int, int]:
    """The ranks' pids, once all four train."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert all(n.poll() is None for n in nodes), [n.communicate()[1][-2000:] for n in nodes]
        pids = rank_pids(run_dir)
        updates = [e for e in read_events(run_dir / "events.jsonl") if e["kind"] == "update"]
        if len(pids) == 4 and len(updates) > 20:
            return pids
        time.sleep(0.2)
    pytest.fail("the run did not start")


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("lost", "store"), [("other", "other"), ("owner", "other"), ("owner", "owner")]
)
def test_a_lost_node_ends_the_run_with_a_summary_from_the_survivor(tmp_path, lost, store):
    """`store`: the node started first, whose agent hosts torchrun's store (the rendezvous
    gives that node rank 0 too); losing it fails the other node's agent at once."""
    run_dir = tmp_path / "owner" / "run"
    port = free_port()
    dirs = {"owner": run_dir, "other": tmp_path / "other" / "run"}
    nodes = {}
    for name in sorted(dirs, key=lambda n: n != store):
        nodes[name] = node(tmp_path, name, name == "owner", port, dirs[name])
        time.sleep(1)  # the first joins first: its agent hosts the store
    owner = nodes["owner"]
    try:
        pids = started(run_dir, list(nodes.values()))
        # rank 0 (the server) runs on the owner node: its agent's child
        assert int(Path(f"/proc/{pids[0]}/stat").read_text().split()[3]) == owner.pid
        os.kill(nodes[lost].pid, signal.SIGKILL)  # the node's agent; its ranks die with it
        killed, killed_at = time.monotonic(), time.time()
        survivor = nodes["other" if lost == "owner" else "owner"]
        _, err = survivor.communicate(timeout=120)
        while not (run_dir / "summary.json").exists() and time.monotonic() < killed + 5:
            time.sleep(0.1)  # (a rank may finish writing it after its agent failed)
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
    else:  # the other node's ranks lost the server and wrote the summary, in timeout_s
        assert summary["status"] == "failed"
        assert summary["error"].startswith(
            "server (rank 0) ended without a summary (its node lost? with worker 0 (rank 1)); "
            "here: server (rank 0) lost"
        ), summary["error"]
        written = (run_dir / "summary.json").stat().st_mtime
        assert written < killed_at + 5  # within timeout_s (5 s) of the loss
        events = read_events(run_dir / "events.jsonl")
        assert events[-1]["event"] == "stop" and events[-1]["status"] == "failed"
    deadline = time.monotonic() + 10
    while [p for p in pids.values() if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [r for r, p in pids.items() if _alive(p)]
    assert not processes_left(tmp_path)


@pytest.mark.timeout(120)
def test_input_refused_on_one_node_ends_every_node_with_its_line(tmp_path):
    """MNIST's files (dataset.root, relative: each node's own directory) on the owner node
    only: the other node's ranks refuse the input; the owner's, whose checks passed, hear
    it through torchrun's store and end too, with the same line, no run directory made."""
    rng = np.random.default_rng(0)
    write_mnist(
        tmp_path / "owner" / "mnist",
        {"x_train": rng.integers(0, 256, size=(40, 8, 8), dtype=np.uint8),
         "y_train": (np.arange(40) % 10).astype(np.uint8),
         "x_test": rng.integers(0, 256, size=(10, 8, 8), dtype=np.uint8),
         "y_test": (np.arange(10) % 10).astype(np.uint8)},
        gz=False,
    )  # fmt: skip
    args = ["dataset=mnist", "dataset.root=mnist", "model=mlp", "dataset.batch_size=4",
            "algorithm=ssp", "cluster.num_workers=3", "budget.max_updates=20", "logger=none",
            "oversubscribe=true"]  # fmt: skip
    port, run_dir = free_port(), tmp_path / "owner" / "run"
    owner = node(tmp_path, "owner", True, port, run_dir, args)
    other = node(tmp_path, "other", False, port, run_dir, args)
    ended = {}
    try:
        for name, proc in (("owner", owner), ("other", other)):
            _, err = proc.communicate(timeout=90)
            ended[name] = (time.monotonic(), proc.returncode, err)
    finally:
        for proc in (owner, other):
            if proc.poll() is None:
                proc.kill()
    said = "stalebench: error: dataset.root: directory 'mnist' does not exist"
    for name, (_, code, err) in ended.items():
        lines = [line for line in err.splitlines() if line.startswith("stalebench: error:")]
        assert code != 0 and len(lines) == 2, (name, err[-3000:])  # its two processes
        assert all(line.startswith(said) for line in lines), (name, lines)
    assert abs(ended["owner"][0] - ended["other"][0]) < 15
    assert not run_dir.exists()
    assert not processes_left(tmp_path)
