"""`stalebench calibrate [overrides] [--name NAME]`: measure this machine for the configured run and
write a cluster profile that a run composes (`cluster=calibrated`).

What it measures, each the median of repeats after a warm-up:

- a training step of the configured model at `dataset.batch_size`, with the run's threads
  per process: forward, backward and an SGD step (`step_ms`);
- how a step grows when k processes step at once on this machine's cores, k = 1, 2, 4, …
  up to twice the cores (`contention`: k → the mean step, ms);
- gloo on the loopback between two processes: the one-way latency of an 8-byte message
  (half a round trip) and the bandwidth of a 16 MB one (`latency_ms`, `bandwidth_gbps`);
- the host (`probe`): one short real run of the configured job with nothing emulated, on
  the fewest workers whose ranks exchange messages (one with a server, else two), then
  the simulator on the profile measured so far: a hub's CPU per message as the real run
  measured it (`hub_ms`: receiving, the server's apply and bookkeeping, replying), and what
  each step cost beyond what the simulator priced (`overhead_ms`: the loop around the
  step, its messages' handling); then the same job with one rank more than the cores, and
  the simulator bisected to its step: what a rank that blocked on a message waits for a
  core once it is in, for each rank beyond the cores (`wake_ms`: the scheduler's latency,
  which oversubscribed cores add).

The profile: `compute_ms` the step, both directions' latency and bandwidth gloo's,
`host_cores` this machine's cores (the ranks of a run share them: the simulator stretches
their work when more are busy than cores), `hub_ms`, `overhead_ms` and `wake_ms`; the measurements
kept in a comment. It is written to `<conf>/cluster/<name>.yaml`, `<conf>`
being `$STALEBENCH_CONF` or `~/.config/stalebench` (`plugins.user_conf`), a folder on
Hydra's search path.
"""

from __future__ import annotations

import copy
import multiprocessing as mp
import socket
import statistics
import time
from pathlib import Path
from typing import Any

NAME = "calibrated"


def _step_once(model, x, y, opt) -> None:
    from stalebench.evaluation import objective

    opt.zero_grad(set_to_none=True)
    objective(model(x), y).backward()
    opt.step()


def _stepper(cfg, splits):
    """(model, x, y, opt): the run's model, a minibatch of its size, an SGD optimizer."""
    import torch

    from stalebench.models import MODELS
    from stalebench.runtime.compute import minibatch

    torch.set_num_threads(cfg.num_threads)
    model = MODELS.build(cfg.model, splits.input_shape, splits.num_classes)
    return model, *minibatch(cfg, splits), torch.optim.SGD(model.parameters(), lr=1e-3)


def step_ms(cfg, splits, repeats: int = 20) -> float:
    from stalebench.runtime.compute import time_step

    model, x, y, opt = _stepper(cfg, splits)
    return 1000 * time_step(model, x, y, repeats, opt=opt)


def _contended(cfg, splits, window: float, start_at, out) -> None:
    model, x, y, opt = _stepper(cfg, splits)
    _step_once(model, x, y, opt)  # warm-up, before the common start
    while time.time() < start_at:
        time.sleep(0.001)
    steps, end = 0, time.perf_counter() + window
    while time.perf_counter() < end:
        _step_once(model, x, y, opt)
        steps += 1
    out.put(window / max(steps, 1))


def contention(cfg, splits, cores: int, window: float = 0.5) -> dict[int, float]:
    """k processes stepping at once, k = 1, 2, 4, … ≤ 2 × cores: the mean step (ms), each
    process stepping for the same `window` of seconds (every process busy all through it,
    so that the k share the cores all the time they are measured)."""
    ctx = mp.get_context("fork")
    out: dict[int, float] = {}
    k = 1
    while k <= 2 * cores:
        queue = ctx.Queue()
        start_at = time.time() + 0.5
        procs = [ctx.Process(target=_contended, args=(cfg, splits, window, start_at, queue))
                 for _ in range(k)]  # fmt: skip
        for p in procs:
            p.start()
        means = [queue.get(timeout=120) for _ in procs]
        for p in procs:
            p.join()
        out[k] = 1000 * statistics.fmean(means)
        k *= 2
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pinger(rank: int, port: int, out) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)  # fmt: skip
    peer = 1 - rank

    def round_trips(buf, n: int) -> float:
        times = []
        for _ in range(n + 1):
            t = time.perf_counter()
            if rank == 0:
                dist.send(buf, peer)
                dist.recv(buf, peer)
            else:
                dist.recv(buf, peer)
                dist.send(buf, peer)
            times.append(time.perf_counter() - t)
        return statistics.median(times[1:])

    small = round_trips(torch.zeros(2), 200)
    large = torch.zeros(4 * 2**20)  # 16 MB
    big = round_trips(large, 5)
    if rank == 0:
        one_way = small / 2
        out.put((one_way, large.numel() * 4 / max(big / 2 - one_way, 1e-9)))
    dist.destroy_process_group()


def loopback() -> tuple[float, float]:
    """gloo between two local processes: (one-way latency s, bandwidth bytes/s)."""
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_pinger, args=(r, port, queue)) for r in (0, 1)]
    for p in procs:
        p.start()
    result = queue.get(timeout=120)
    for p in procs:
        p.join(timeout=30)
    return result


def machine(cfg, splits, cores: int) -> dict[str, Any]:
    """The machine alone: `cfg`'s step, k processes stepping at once, gloo's loopback."""
    latency_s, bytes_per_s = loopback()
    return {
        "step_ms": step_ms(cfg, splits),
        "contention": contention(cfg, splits, cores),
        "latency_ms": 1000 * latency_s,
        "bandwidth_gbps": 8 * bytes_per_s / 1e9,
    }


def measure(cfg, splits, cores: int) -> dict[str, Any]:
    """The machine and `cfg`'s host on it (`probe`)."""
    m = machine(cfg, splits, cores)
    return {**m, **probe(cfg, m, cores)}


PROBE_S = 2.0  # the probe's run, seconds
HOST = ("hub_ms", "overhead_ms", "wake_ms")  # what `probe` fits
PROBE_REPEATS = 3  # its real runs, the median taken


def profiled(cfg, m: dict[str, Any], cores: int, workers: int):
    """`cfg` on the measured profile `m` (the host's measurements where it has them):
    `workers` equal workers, nothing else emulated (no topology, faults or slow workers)."""
    from stalebench.cluster import ClusterConfig

    run = copy.deepcopy(cfg)
    run.cluster = ClusterConfig(
        preset="calibrated", num_workers=workers, compute_ms=m["step_ms"],
        push_latency_ms=m["latency_ms"], pull_latency_ms=m["latency_ms"],
        push_bandwidth_gbps=m["bandwidth_gbps"], pull_bandwidth_gbps=m["bandwidth_gbps"],
        host_cores=cores, overhead_ms=m.get("overhead_ms", 0.0), hub_ms=m.get("hub_ms", 0.0),
        stall_ms=m.get("stall_ms", 0.0), wake_ms=m.get("wake_ms", 0.0),
        wake_form=cfg.cluster.wake_form,
    )  # fmt: skip
    return run


def probe(cfg, m: dict[str, Any], cores: int, repeats: int = PROBE_REPEATS) -> dict[str, Any]:
    """The host: `repeats` real runs of `cfg` for PROBE_S seconds each with nothing
    emulated (real compute, real gloo), on the fewest workers whose ranks exchange messages
    (1 with a hub, else 2), the median run taken (one run is at the mercy of whatever else
    the machine did in its 2 seconds), and the simulator on the machine's measurements in
    `m` (not the host fields it may carry: another job's probe) with that run's hub CPU per
    message: `hub_ms` (0 without a hub), and `overhead_ms`, what a step of the real run took
    beyond the simulator's (0 when the simulator is the slower), all of it on the shared
    cores (the real run's CPU a step, summary.json's `cycle`, is kept beside it:
    `probe_cycle_ms`; splitting off the part on no core as `cluster.stall_ms` did not
    predict held-out runs better, benchmarks/host_form.py). Then `repeats` real
    runs with one rank more than the cores (at least one worker more), and `wake_ms`
    bisected until the simulator's step on them is the real one's (0 when the engine takes
    no more workers)."""
    from stalebench.errors import ConfigError

    m = _machine(m)

    def real_runs(workers: int) -> list[dict[str, Any]]:
        real = profiled(cfg, m, cores, workers)
        real.cluster.compute_ms = 0.0  # nothing emulated
        for key in ("push_latency_ms", "pull_latency_ms", "push_bandwidth_gbps",
                    "pull_bandwidth_gbps"):  # fmt: skip
            setattr(real.cluster, key, 0.0)
        runs = (_probe_run(copy.deepcopy(real), "real") for _ in range(repeats))
        return sorted(runs, key=_step_s)

    found: dict[str, Any] = {}
    for workers in (1, 2):
        try:
            runs = real_runs(workers)
        except ConfigError:  # the engine takes more workers
            continue
        if workers == 1 and "hub" not in runs[0]:
            continue  # one worker alone sends nothing: its messages' cost is not in it
        got = runs[len(runs) // 2]
        hub_ms = (got.get("hub") or {}).get("cpu_ms", 0.0)
        sim = _probe_run(profiled(cfg, {**m, "hub_ms": hub_ms}, cores, workers), "sim")
        per_step = {"real": _step_s(got), "sim": _step_s(sim)}
        overhead = max(0.0, (per_step["real"] - per_step["sim"]) * workers)
        found = {"probe_workers": workers, "probe_hub": "hub" in got, "hub_ms": hub_ms,
                 "overhead_ms": 1000 * overhead, "probe_cycle_ms": got.get("cycle"),
                 "probe_step_ms": {k: 1000 * v for k, v in per_step.items()},
                 "probe_real_step_ms": [round(1000 * _step_s(r), 4) for r in runs]}  # fmt: skip
        break
    if not found:
        raise RuntimeError(
            f"calibrate's probe: engine={cfg.engine.name} takes neither 1 nor 2 workers"
        )
    # the scheduler's latency: the same job with one rank more than the cores
    more = max(found["probe_workers"] + 1, cores + 1 - found["probe_hub"])
    try:
        real_s = _step_s(real_runs(more)[repeats // 2])
    except ConfigError:  # the engine takes no more workers
        return {**found, "wake_ms": 0.0, "wake_form": cfg.cluster.wake_form}

    found = {**found, "wake_probe_workers": more, "wake_probe_step_ms": {"real": 1000 * real_s}}
    return {**found, **fit_wake(cfg, m, found, cores)}


def fit_wake(cfg, m: dict[str, Any], host: dict[str, Any], cores: int) -> dict[str, Any]:
    """`wake_ms` in `cfg`'s `cluster.wake_form`, bisected until the simulator's step on the
    wake-up probe's workers is the real one's `host` holds (`probe`'s); with the step the
    simulator then takes and the form."""
    more, real_s = host["wake_probe_workers"], host["wake_probe_step_ms"]["real"] / 1000
    machine = _machine(m)

    def sim_s(wake_ms: float) -> float:
        on = profiled(cfg, {**machine, **host, "wake_ms": wake_ms}, cores, more)
        return _step_s(_probe_run(on, "sim"))

    wake_ms = fit(sim_s, real_s, 1000 * real_s * more)
    steps = {"real": 1000 * real_s, "sim": 1000 * sim_s(wake_ms)}
    return {"wake_ms": wake_ms, "wake_form": cfg.cluster.wake_form, "wake_probe_step_ms": steps}


def _machine(m: dict[str, Any]) -> dict[str, Any]:
    """The machine's measurements alone: what a probe fits is fitted on a simulator without
    it (`m` may carry another job's host, as `measure` returns it)."""
    return {k: v for k, v in m.items() if k not in HOST}


def _probe_run(cfg, runtime: str) -> dict[str, Any]:
    """`cfg` for PROBE_S seconds in `runtime`, nothing logged; its summary."""
    import tempfile

    from stalebench import experiment
    from stalebench.config import LoggerConfig

    cfg.runtime, cfg.logger, cfg.oversubscribe = runtime, LoggerConfig(name="none"), True
    cfg.budget.max_updates, cfg.budget.max_wall_s = 0, PROBE_S
    with tempfile.TemporaryDirectory() as tmp:
        cfg.run_dir = tmp
        summary = experiment.run(cfg)
    if summary["status"] != "completed":
        raise RuntimeError(f"calibrate's probe ({runtime}) ended {summary['status']}: "
                           f"{summary.get('error')}")  # fmt: skip
    return summary


def _step_s(summary: dict[str, Any]) -> float:
    """A run's seconds per gradient."""
    return summary["run_time_s"] / max(summary["gradients"], 1)


def fit(f, target: float, hi: float, steps: int = 8) -> float:
    """The x in [0, hi] at which the nondecreasing `f` reaches `target`, by bisection
    (`steps` halvings): 0 when f(0) already does, hi when f(hi) does not."""
    if f(0.0) >= target:
        return 0.0
    if f(hi) < target:
        return hi
    lo = 0.0
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return (lo + hi) / 2


def profile_yaml(cfg, m: dict[str, Any], cores: int, name: str = NAME) -> str:
    """The cluster profile of the measurements `m`."""
    grows = ", ".join(f"{k}: {ms:.3f}" for k, ms in m["contention"].items())
    return "\n".join([
        f"# `stalebench calibrate` on {socket.gethostname()}, {cores} cores, "
        f"{time.strftime('%Y-%m-%d %H:%M')}: model={cfg.model.name}, "
        f"dataset={cfg.dataset.name}, batch {cfg.dataset.batch_size}, "
        f"{cfg.num_threads} thread(s) per process",
        f"# a step (forward, backward, SGD): {m['step_ms']:.3f} ms",
        f"# k processes stepping at once, mean step (ms): {{{grows}}}",
        f"# gloo on the loopback: {m['latency_ms']:.4f} ms one way, "
        f"{m['bandwidth_gbps']:.2f} Gbit/s",
        f"# the probe (a real run of the job, {m['probe_workers']} worker(s), nothing "
        f"emulated): a step every {m['probe_step_ms']['real']:.3f} ms a worker, the "
        f"simulator {m['probe_step_ms']['sim']:.3f} ms before overhead_ms; the hub's "
        f"CPU {m['hub_ms']:.3f} ms a message",
        *(
            [f"# the wake-up probe ({m['wake_probe_workers']} workers, more ranks than "
             f"cores): a step every {m['wake_probe_step_ms']['real']:.3f} ms a worker, the "
             f"simulator {m['wake_probe_step_ms']['sim']:.3f} ms with wake_ms"]  # fmt: skip
            if "wake_probe_workers" in m
            else []
        ),
        f"preset: {name}",
        "compute: constant",
        f"compute_ms: {m['step_ms']:.4f}",
        f"push_latency_ms: {m['latency_ms']:.4f}",
        f"pull_latency_ms: {m['latency_ms']:.4f}",
        f"push_bandwidth_gbps: {m['bandwidth_gbps']:.3f}",
        f"pull_bandwidth_gbps: {m['bandwidth_gbps']:.3f}",
        f"host_cores: {cores}",
        f"overhead_ms: {m['overhead_ms']:.4f}",
        f"hub_ms: {m['hub_ms']:.4f}",
        f"wake_ms: {m.get('wake_ms', 0.0):.4f}",
        f"wake_form: {cfg.cluster.wake_form}  # the form wake_ms was fitted in",
        "",
    ])  # fmt: skip


def run(cfg, name: str = NAME) -> Path:
    """Measure this machine for `cfg` and write the profile `name`; its path."""
    from stalebench.job import load_splits
    from stalebench.plugins import user_conf
    from stalebench.runtime.compute import cores

    splits = load_splits(cfg)
    have = cores()
    m = measure(cfg, splits, have)
    path = user_conf() / "cluster" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(profile_yaml(cfg, m, have, name))
    return path
