"""The real runtime's numerics against PyTorch's own synchronous data parallelism: from the
same θ₀ and the same per-rank data order, 50 steps of allreduce-BSP and of PS-BSP end with
parameters bit-identical to `DistributedDataParallel` over gloo with `torch.optim.SGD`
(2 processes, CPU); so do allreduce-BSP's overlapped rounds, in DDP-like buckets and in
P3's slices applied layer by layer. A harness that reordered a sum, dropped a batch or
applied a stale gradient would differ in the last bits at least."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector

from tests.conftest import compose, fast_with, free_port, run_job

STEPS = 50
ARGS = ["algorithm=bsp", "cluster.num_workers=2", f"budget.max_updates={STEPS}"]


def _ddp(rank: int, port: int, overrides: list[str], out: str) -> None:
    from stalebench.job import Job

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    job = Job.build(compose(overrides))
    model = torch.nn.parallel.DistributedDataParallel(job.model())
    opt = torch.optim.SGD(model.parameters(), lr=job.cfg.algorithm.update.lr)
    batches = job.batches(rank)
    for _ in range(STEPS):
        x, y = next(batches)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    if rank == 0:
        torch.save(parameters_to_vector(model.parameters()).detach(), out)
    dist.barrier()
    os._exit(0)  # no teardown: gloo's threads can abort an exiting process


def ddp_params(tmp_path) -> torch.Tensor:
    port = free_port()
    out = str(tmp_path / "ddp.pt")
    mp.start_processes(_ddp, args=(port, fast_with(ARGS), out), nprocs=2, start_method="spawn")
    return torch.load(out)


def final_params(run) -> torch.Tensor:
    assert run.summary["status"] == "completed" and run.summary["updates"] == STEPS
    return torch.cat([t.flatten() for t in torch.load(run.dir / "model.pt").values()])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_allreduce_bsp_and_ps_bsp_end_bit_identical_to_ddp(tmp_path):
    reference = ddp_params(tmp_path)
    fifo = ["engine=allreduce", "engine.bucket_mb=0.0005"]  # 131 floats: 2 buckets, 8 slices
    runs = {
        "allreduce": ["engine=allreduce"],
        "ps": ["engine=ps"],
        "buckets": fifo,
        "p3": [*fifo, "engine.schedule=p3"],
    }
    for name, args in runs.items():
        ours = final_params(run_job(tmp_path / name, [*ARGS, *args]))
        assert ours.shape == reference.shape
        assert torch.equal(ours, reference), (name, (ours - reference).abs().max())
