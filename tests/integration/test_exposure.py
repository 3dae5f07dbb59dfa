"""A run exposes nothing: every socket its processes listen on is bound to the loopback
(the rendezvous store is unauthenticated), and a secret in the environment reaches no file
the run writes (config, events, summary, logs, the W&B run). Real processes, through the
CLI."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stalebench.metrics.events import read_events
from tests.integration.test_cli import FAST, _pids

pytestmark = pytest.mark.slow

SECRET = "sk-stalebench-test-0123456789abcdef"


def _address(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])  # /proc/net/tcp: host byte order
    words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
    return ipaddress.IPv6Address(b"".join(words))


def listening(pids: list[int]) -> list[tuple[int, str]]:
    """(pid, local address) of every TCP socket the processes listen on."""
    inodes: dict[str, int] = {}
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes[target[8:-1]] = pid
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                out.append((inodes[inode], str(_address(local.split(":")[0]))))
    return out


@pytest.mark.timeout(180)
def test_every_listening_socket_is_on_loopback_and_no_secret_is_written(tmp_path, wandb_home):
    run_dir = tmp_path / "run"
    env = {**os.environ, "STALEBENCH_TEST_SECRET": SECRET, "AWS_SECRET_ACCESS_KEY": SECRET}
    proc = subprocess.Popen(
        [sys.executable, "-m", "stalebench.cli", "algorithm=asp", "cluster.num_workers=2"]
        + [*FAST[:-1], "budget.max_wall_s=3", "logger=wandb", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline, seen = time.monotonic() + 90, []
        while time.monotonic() < deadline and proc.poll() is None:
            pids = _pids(run_dir) if (run_dir / "logs").exists() else {}
            updates = [e for e in read_events(run_dir / "events.jsonl") if e["kind"] == "update"]
            if len(pids) == 3 and updates:
                seen = listening([proc.pid, *pids.values()])
                break
            time.sleep(0.2)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert {pid for pid, _ in seen} >= {proc.pid}, seen  # the store listens in the top process
    assert [a for _, a in seen if not ipaddress.ip_address(a).is_loopback] == [], seen
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any("wandb" in p.parts for p in written)  # the W&B run is among them
    assert [p for p in written if SECRET.encode() in p.read_bytes()] == []
    assert SECRET not in out + err
