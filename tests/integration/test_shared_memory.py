"""Same-host mailboxes: two real processes over gloo, messages whose payload stays in shared
memory; and the launcher's shared-memory directory, gone after a run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from stalebench.runtime import launch
from stalebench.runtime.transport import Gloo, SharedMemory
from tests.conftest import free_port, run_job

HEADER, SIZE = 4, 1000


def _rank(rank: int, port: int, directory: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)  # fmt: skip
    t = SharedMemory(Gloo(10, str), Path(directory))
    to_1, to_0 = t.mailbox(0, 1, SIZE, HEADER), t.mailbox(1, 0, SIZE, HEADER)
    plain = torch.empty(SIZE)
    if rank == 0:
        for k in range(3):
            to_1[:] = torch.arange(SIZE) + k
            t.send(to_1, 1)  # its header over gloo, the payload in place
            t.recv(to_0, 1)
            assert torch.equal(to_0, -(torch.arange(SIZE) + k))
        t.send(torch.full((SIZE,), 7.0), 1)  # not a mailbox: the whole of it over gloo
        torch.save({"sent": t.bytes_sent, "gloo": t.inner.bytes_sent}, out)
    else:
        for _ in range(3):
            t.recv(to_1, 0)
            to_0[:] = -to_1
            t.send(to_0, 0)
        t.recv(plain, 0)
        assert torch.equal(plain, torch.full((SIZE,), 7.0))
    dist.barrier()
    os._exit(0)  # no teardown: gloo's threads can abort an exiting process


@pytest.mark.timeout(120)
def test_a_mailbox_carries_the_payload_in_shared_memory_and_counts_it_as_sent(tmp_path):
    directory = tmp_path / "shm"
    directory.mkdir()
    port = free_port()
    out = tmp_path / "bytes.pt"
    mp.start_processes(_rank, args=(port, str(directory), str(out)), nprocs=2,
                       start_method="spawn")  # fmt: skip
    counts = torch.load(out)
    # three messages of 1,000 float32 and one plain one, counted whole; over gloo went
    # three headers and the plain message
    assert counts == {"sent": 4 * 4 * SIZE, "gloo": 3 * 4 * HEADER + 4 * SIZE}
    assert list(directory.iterdir()) == []  # each file unlinked once both ranks mapped it


@pytest.mark.timeout(120)
def test_a_run_leaves_no_shared_memory_and_sweeps_what_killed_runs_left(tmp_path, monkeypatch):
    shm = tmp_path / "shm"
    (shm / "stalebench-999999999-dead").mkdir(parents=True)  # no such pid
    (shm / f"stalebench-{os.getpid()}-live").mkdir()
    monkeypatch.setattr(launch, "SHM", str(shm))
    run = run_job(tmp_path / "run", ["algorithm=asp", "budget.max_updates=40"])
    assert run.summary["status"] == "completed"
    assert [p.name for p in shm.iterdir()] == [f"stalebench-{os.getpid()}-live"]
