"""The allreduce engine on the real runtime: BSP the way DDP does it. Every rank holds a
replica, averages the round's gradients with one all-reduce, and takes the same local
optimizer step (the configured update rule with the mean gradient, worker −1, lag 0).

One all-reduce per round carries the gradient and, in a tail of 3·N + 1 slots, each rank's
compute time and loss and rank 0's stop flag, so all replicas stop on the same round. The
cluster profile's network is paid as a sleep of `Profile.allreduce_s` of that whole message
per round. Rank 0 writes the run directory.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from stalebench.algorithms.base import UPDATES
from stalebench.experiment import Job
from stalebench.runtime.common import RunRecord, diverged, gradient, pad_to, spent


def round_slots(num_params: int, num_workers: int) -> int:
    """Float32 slots one round all-reduces: the gradient, then 3 per rank and a stop flag."""
    return num_params + 3 * num_workers + 1


def round_bytes(num_params: int, num_workers: int) -> int:
    """Size of the message one round all-reduces (the tail counts: it travels with it)."""
    return 4 * round_slots(num_params, num_workers)


def ring_volume(nbytes: int, num_workers: int) -> int:
    """Bytes all ranks together send in one ring all-reduce of `nbytes`: 2(N − 1)·nbytes."""
    return 2 * (num_workers - 1) * nbytes


def replica(job: Job, rank: int, run_dir: Path) -> dict[str, Any] | None:
    cfg, n = job.cfg, job.cfg.cluster.num_workers
    device = job.device(rank)
    model = job.model()
    params = parameters_to_vector(model.parameters()).detach().clone()
    rule = UPDATES.build(cfg.algorithm.update, params, n)
    net = job.model().to(device)
    net_params = list(net.parameters())
    d = params.numel()
    buf = torch.zeros(round_slots(d, n))
    batches = job.batches(rank)
    profile = job.profile
    network_s = profile.allreduce_s(round_bytes(d, n))  # the same message every round
    record = RunRecord(job, run_dir) if rank == 0 else None
    status, error, stop, version, bytes_sent = "completed", None, False, 0, 0
    gradient(net, net_params, (job.splits.x_train[:1], job.splits.y_train[:1]), device)  # warm-up
    dist.barrier()
    t0 = time.perf_counter()
    try:
        while True:
            start = time.perf_counter()
            vector_to_parameters(params.to(device), net_params)
            grad, loss = gradient(net, net_params, next(batches), device)
            target_s = profile.step_s(rank)
            pad_to(start, target_s)
            compute = time.perf_counter() - start
            buf.zero_()
            buf[:d] = grad
            buf[d + 3 * rank : d + 3 * rank + 2] = torch.tensor([compute, loss])
            buf[-1] = float(stop)
            # the modelled network is part of the all-reduce's time (comm_s), as in the sim
            reduce_start = time.perf_counter()
            time.sleep(network_s)
            dist.all_reduce(buf)
            reduce_s = time.perf_counter() - reduce_start
            if buf[-1] > 0:  # rank 0 decided last round that this one is not applied
                break
            rule.step(params, buf[:d].div_(n), -1, 0)
            version += 1
            bytes_sent += ring_volume(buf.numel() * 4, n)
            if record is not None:
                t = time.perf_counter() - t0
                stats = buf[d:-1].view(n, 3)
                slowest = float(stats[:, 0].max())
                for w in range(n):
                    record.events.emit(
                        "update",
                        t,
                        worker=w,
                        clock=version - 1,
                        version=version,
                        lag=0,
                        loss=float(stats[w, 1]),
                        compute_s=float(stats[w, 0]),
                        wait_s=slowest - float(stats[w, 0]),
                        comm_s=max(reduce_s - (slowest - compute), 0.0),
                        clock_gap=0,
                    )
                record.snapshots.maybe(t, version, params)
                if diverged(float(stats[:, 1].sum()), params):
                    status, stop = "diverged", True
                stop = stop or spent(cfg.budget, version, t)
    except Exception as exc:
        status, error = "failed", str(exc)
        if record is None:
            raise
    if record is None:
        return None
    return record.finish(
        model, params, version, time.perf_counter() - t0, status, error, bytes_sent=bytes_sent
    )
