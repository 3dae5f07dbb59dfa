"""docs/clusters.md's commands, run as the page gives them on emulated nodes (two torchrun
agents on 127.0.0.1, each in its own directory; submitit's local executor), with GPUS=2,
no GPU, and SPEED appended: a small model and a short budget. The SLURM line is composed,
not submitted."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stalebench.runtime.nodes import own_log_dir
from tests.conftest import free_port, processes_left
from tests.integration.test_cli import FAST, ROOT, stalebench
from tests.unit.test_cifar_resnet import ALL_FILES, TEST_FILE, write_cifar

pytestmark = pytest.mark.slow

PAGE = ROOT / "docs" / "clusters.md"
SPEED = ["model=mlp", "'model.hidden=[32]'", "dataset.batch_size=8", "budget.max_updates=30",
         "budget.max_wall_s=0", "eval.every_updates=10", "logger=none",
         "oversubscribe=true"]  # fmt: skip


def commands() -> list[str]:
    """The page's bash blocks, each one command: its `export` line left out, its lines
    joined."""
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.S)
    return [
        " ".join(
            line.rstrip("\\").strip()
            for line in block.splitlines()
            if line.strip() and not line.startswith(("export ", "#"))
        )
        for block in blocks
    ]


def bin_path() -> str:
    """PATH with this interpreter's scripts first (torchrun, stalebench)."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


@pytest.mark.timeout(180)
def test_the_run_over_two_nodes(tmp_path):
    """Each node runs the page's command in its own directory: one run over both, its
    records whole on the node of NODE_RANK=0, the other node's logs gathered there."""
    rng = np.random.default_rng(0)
    raw = {name: (rng.integers(0, 256, size=(10 if name == TEST_FILE else 20, 3072),
                               dtype=np.uint8), [j % 10 for j in range(20)])
           for name in ALL_FILES}  # fmt: skip
    raw[TEST_FILE] = (raw[TEST_FILE][0], raw[TEST_FILE][1][:10])
    data = write_cifar(tmp_path / "data" / "cifar-10-batches-py", raw)
    command = f"{commands()[0]} {' '.join(SPEED)}"
    env = {**os.environ, "HEAD": "127.0.0.1", "PORT": str(free_port()), "GPUS": "2",
           "DATA": str(data), "PATH": bin_path()}  # fmt: skip
    procs = []
    for node in ("0", "1"):
        (tmp_path / f"node{node}").mkdir()
        procs.append(subprocess.Popen(
            ["bash", "-c", command], cwd=tmp_path / f"node{node}", env={**env, "NODE_RANK": node},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))  # fmt: skip
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=150)
            assert proc.returncode == 0, err[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    run_dir = tmp_path / "node0" / "runs" / "resnet20-bsp"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["updates"], summary["num_workers"]) == ("completed", 30, 4)
    assert summary["engine"] == "allreduce" and summary["arithmetic"]["precision"] == "bf16"
    assert summary["step_time"] == "measured"  # cluster.compute_ms=0: nothing padded
    assert summary["cycle"]["steps"] >= 4 * 29  # every rank's steps, the other node's too
    assert [r["rank"] for r in summary["ranks"]] == [0, 1, 2, 3]
    logs = sorted(p.name for p in (run_dir / "logs").glob("rank-*.log"))
    assert logs == ["rank-0.log", "rank-1.log", "rank-2.log", "rank-3.log"]
    own = sorted(p.name for p in own_log_dir(run_dir).glob("rank-*.log"))
    assert own == ["rank-2.log", "rank-3.log"]  # the other node's: after the owner's ranks
    for name in own:  # as it was when its rank closed (before its last line, "done")
        gathered = (run_dir / "logs" / name).read_text()
        assert "process group ready" in gathered
        assert (own_log_dir(run_dir) / name).read_text().startswith(gathered)
    assert not (tmp_path / "node1" / "runs").exists()
    assert not processes_left(tmp_path)


def test_the_slurm_line_composes():
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from stalebench.config import register_configs
    from stalebench.plugins import load as load_plugins

    line = commands()[1].split()
    assert line[:2] == ["stalebench", "-m"]
    overrides = [o for o in line[2:] if not o.startswith("seed=")]  # a sweep's axis
    load_plugins()
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module("stalebench.conf", version_base=None):
            cfg = compose("config", overrides=overrides, return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert (launcher.partition, launcher.timeout_min, launcher.cpus_per_task) == ("gpu", 240, 8)
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (2, 8, 8)
    assert (launcher.mem_gb, launcher.max_num_timeout) == (256, 3)
    assert launcher.nodes * launcher.tasks_per_node == cfg.cluster.num_workers + 1  # a server


@pytest.mark.timeout(300)
def test_the_one_machine_sweep(tmp_path):
    """The local executor's 3 tasks a job: the job whose run has 3 ranks is one run of
    them, its events and summary agreeing; the one whose run has 2 is refused by name on
    every task, recorded `invalid`, and never runs twice into its directory."""
    line = commands()[2].split()
    assert line[:2] == ["stalebench", "-m"]
    done = stalebench(
        [*line[1:], "hydra.sweep.dir=sweep", *FAST, "budget.max_updates=40", "logger=none"],
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
    assert (sweep / "report.md").is_file()
    assert not processes_left(tmp_path)
