"""The references stalebench is measured against, written directly on PyTorch: the
plainest training loop, DistributedDataParallel over gloo, a hand-written gloo parameter
server, and a `torch.distributed.rpc` one. Each trains the model stalebench would build
for the same overrides (same θ₀, batch and data stream) with one thread per process, and
returns steps (or updates) per second over its timed steps, after a warm-up.
"""

from __future__ import annotations

import os
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from stalebench import precision
from stalebench.job import Job
from stalebench.runtime.faults import pad_to
from stalebench.runtime.link import LinkClock, Pace
from stalebench.runtime.network import Network
from tests.conftest import compose, free_port

WARMUP = 10


def build(overrides: list[str], workers: int) -> Job:
    torch.set_num_threads(1)
    return Job.build(compose([*overrides, f"cluster.num_workers={workers}"]))


def plain_loop(overrides: list[str], steps: int) -> float:
    """Steps/s of forward, backward and `torch.optim.SGD` in one process, on the run's
    device (`Job.device`: the GPU when `device` allows one and there is one), so that a GPU
    run's rate is compared with a plain loop on the same GPU, never with the CPU; the
    forward pass under the run's `precision` (bf16: autocast), as its workers compute."""
    job = build(overrides, 1)
    device = job.device(0)
    model, batches = job.model().to(device), job.batches(0)
    opt = torch.optim.SGD(model.parameters(), lr=job.cfg.algorithm.update.lr)
    for k in range(WARMUP + steps):
        if k == WARMUP:
            sync(device)
            start = time.perf_counter()
        x, y = next(batches)
        opt.zero_grad(set_to_none=True)
        with precision.autocast(device):
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
    sync(device)
    return steps / (time.perf_counter() - start)


def sync(device: torch.device) -> None:
    """Wait for the work queued on `device` (a GPU runs asynchronously to the host)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def spawn(target, world: int, *args) -> float:
    """Run `target(rank, world, port, out, *args)` in `world` processes; rank 0's figure."""
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, out, *args)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
        if p.exitcode != 0:
            raise RuntimeError(f"{target.__name__} rank exited with {p.exitcode}")
    return out.get()


def _init(rank: int, world: int, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )


def ddp_rank(rank: int, world: int, port: int, out, overrides: list[str], steps: int) -> None:
    """DDP over gloo: each rank its shard, gradients averaged by DDP's bucketed all-reduce
    overlapping backward, then SGD."""
    _init(rank, world, port)
    job = build(overrides, world)
    model = torch.nn.parallel.DistributedDataParallel(job.model())
    opt = torch.optim.SGD(model.parameters(), lr=job.cfg.algorithm.update.lr)
    batches = job.batches(rank)

    def step() -> None:
        x, y = next(batches)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    timed_steps(rank, out, steps, step)


def timed_steps(rank: int, out, steps: int, step) -> None:
    """`step()` WARMUP + `steps` times on every rank; rank 0 puts the steps/s of the timed
    ones (between barriers) on `out`; then the process exits."""
    for k in range(WARMUP + steps):
        if k == WARMUP:
            dist.barrier()
            start = time.perf_counter()
        step()
    dist.barrier()
    if rank == 0:
        out.put(steps / (time.perf_counter() - start))
    dist.barrier()
    os._exit(0)  # no teardown: gloo's threads can abort an exiting process


def ddp_profiled_rank(
    rank: int, world: int, port: int, out, overrides: list[str], steps: int, bucket_mb: float
) -> None:
    """DDP under the overrides' cluster profile, as stalebench's allreduce engine pays it:
    each bucket DDP all-reduces is a ring all-reduce on a link that carries one at a time
    (`LinkClock`), DDP waits for its buckets at the end of backward, and the profile's step
    time is spread over forward and backward by the same hooks (`Pace`). DDP's own bucketing
    (`bucket_cap_mb`, its order rebuilt after the first step) and overlap are untouched."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    _init(rank, world, port)
    job = build(overrides, world)
    net = job.model()
    pace = Pace(net, list(net.parameters()))
    model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=bucket_mb)
    clock, ends = LinkClock(Network(job.cfg.cluster)), []

    def hook(state, bucket):
        ends.append(clock.issue(4 * bucket.buffer().numel()))
        return allreduce_hook(None, bucket)

    model.register_comm_hook(None, hook)
    opt = torch.optim.SGD(model.parameters(), lr=job.cfg.algorithm.update.lr)
    batches = job.batches(rank)

    def step() -> None:
        x, y = next(batches)
        pace.start(job.profile.step_s(rank))
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        pace.backward()
        loss.backward()
        pad_to(0.0, max(ends))  # the last bucket is through the emulated link
        ends.clear()
        opt.step()

    timed_steps(rank, out, steps, step)


def gloo_ps_rank(rank: int, world: int, port: int, out, overrides: list[str], steps: int) -> None:
    """Rank 0 serves: a thread per worker receives its gradient, applies SGD under a lock
    and sends θ back (asynchronous SGD); each worker computes on the θ it last received."""
    _init(rank, world, port)
    job = build(overrides, world - 1)
    model = job.model()
    theta = parameters_to_vector(model.parameters()).detach().clone()
    lr, n = job.cfg.algorithm.update.lr, world - 1
    if rank == 0:
        lock, times = threading.Lock(), []

        def serve(w: int) -> None:
            grad = torch.empty_like(theta)
            with lock:
                dist.send(theta, w)
            for k in range(WARMUP + steps):
                dist.recv(grad, w)
                with lock:
                    theta.add_(grad, alpha=-lr)
                    times.append(time.perf_counter())
                    if k < WARMUP + steps - 1:  # the worker reads no θ after its last push
                        dist.send(theta, w)

        threads = [threading.Thread(target=serve, args=(w,)) for w in range(1, world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        timed = sorted(times)[n * WARMUP :]
        out.put((len(timed) - 1) / (timed[-1] - timed[0]))
    else:
        params, batches = list(model.parameters()), job.batches(rank - 1)
        for _ in range(WARMUP + steps):
            dist.recv(theta, 0)
            vector_to_parameters(theta, params)
            x, y = next(batches)
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            dist.send(parameters_to_vector(p.grad for p in params), 0)
    dist.barrier()
    os._exit(0)  # no teardown: gloo's threads can abort an exiting process


_SERVER: dict = {}


def _push(grad: torch.Tensor) -> torch.Tensor:
    """Runs on the RPC server: apply one gradient, return the new θ."""
    s = _SERVER
    with s["lock"]:
        s["theta"].add_(grad, alpha=-s["lr"])
        s["times"].append(time.perf_counter())
        return s["theta"].clone()


def rpc_ps_rank(rank: int, world: int, port: int, out, overrides: list[str], steps: int) -> None:
    """The same asynchronous SGD with `torch.distributed.rpc`: a worker's push is one
    `rpc_sync` that returns the new θ."""
    from torch.distributed import rpc

    torch.set_num_threads(1)
    job = build(overrides, world - 1)
    model = job.model()
    theta = parameters_to_vector(model.parameters()).detach().clone()
    if rank == 0:
        _SERVER.update(theta=theta, lr=job.cfg.algorithm.update.lr, lock=threading.Lock(), times=[])
    opts = rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=4, init_method=f"tcp://127.0.0.1:{port}", _transports=["uv"]
    )
    rpc.init_rpc(f"r{rank}", rank=rank, world_size=world, rpc_backend_options=opts)
    if rank > 0:
        params, batches = list(model.parameters()), job.batches(rank - 1)
        for _ in range(WARMUP + steps):
            vector_to_parameters(theta, params)
            x, y = next(batches)
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            theta = rpc.rpc_sync("r0", _push, args=(parameters_to_vector(p.grad for p in params),))
    rpc.shutdown()
    if rank == 0:
        timed = sorted(_SERVER["times"])[(world - 1) * WARMUP :]
        out.put((len(timed) - 1) / (timed[-1] - timed[0]))
    os._exit(0)


def import_torch_s() -> float:
    """Wall seconds of `python -c "import torch"`."""
    import subprocess
    import sys

    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True, env=dict(os.environ))
    return time.perf_counter() - start
