"""The compute model: how long a worker's step takes, when it follows the run's own model on
a named device instead of a hand-written `cluster.compute_ms`.

A step is the model's forward and backward on one minibatch of `dataset.batch_size`. Its
floating-point operations are counted by torch's FLOP counter
(`torch.utils.flop_counter.FlopCounterMode`: matrix multiplications and convolutions,
which dominate; element-wise work is not counted) on the meta device, so a model of any
size is counted without memory. The step lasts

    FLOPs / (peak FLOP/s of `cluster.device` at `cluster.precision` × `cluster.utilization`)

and that mean becomes `cluster.compute_ms`: every step-time model (gamma, lognormal,
slowdowns, stragglers, slow_compute faults) composes on top of it as on a hand-written one.

The peaks are the vendors' dense (no sparsity) datasheet figures; `utilization` is an
estimate (default 0.4: large convolutional and transformer training steps reach 30–50 % of
a GPU's dense peak; small models far less). Both are estimates until measured on the
machine in question (`stalebench calibrate`).
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import time

from stalebench.cluster import DEVICES


class Host:
    """The simulator's host model: the run's `size` ranks share `cores` cores (0: a core
    each, nothing shared). A rank's CPU work of `seconds` starting at `start` (a step, a
    hub's handling of a message) is stretched by the ranks busy then, itself included, over
    the cores, when they outnumber them: processor sharing, with the share fixed when the
    work starts (a rank that starts later does not slow it after the fact). While the
    run's ranks outnumber the cores, a rank that blocked on a message (a reply, a
    collective's end) waits for a core once it is in (`wake`), the scheduler's latency,
    which a fluid share of the cores does not have: `wake_s` with one rank beyond the
    cores, growing with them as the `form` says (`cluster.wake_form`): `sqrt`, as the
    square root of the run's ranks past the cores (it predicted held-out runs better than
    growing in proportion: benchmarks/host_form.py); `queued`, in proportion to them (which
    predicted better than a constant wait: benchmarks/wake_form.py); `busy`, in proportion
    to the ranks busy when it wakes, itself included, past the cores (a core that no rank
    is using takes it at once)."""

    def __init__(self, cores: int, size: int, wake_s: float = 0.0, form: str = "sqrt"):
        self.cores, self.form = cores, form
        self.busy = [(0.0, 0.0)] * size  # each rank's latest CPU work: (start, end)
        self.wake_s = wake_s if 0 < cores < size else 0.0
        if form == "queued":
            self.wake_s *= size - cores
        elif form == "sqrt":
            self.wake_s *= math.sqrt(max(size - cores, 0))

    def wake(self, rank: int, at: float) -> float:
        """What `rank`, which blocked, waits for a core once its message is in at `at`
        (seconds)."""
        if self.form != "busy" or not self.wake_s:
            return self.wake_s
        return self.wake_s * max(0, self._busy(rank, at) - self.cores)

    def _busy(self, rank: int, at: float) -> int:
        """The ranks busy at `at`, `rank` included."""
        return 1 + sum(a <= at < b for r, (a, b) in enumerate(self.busy) if r != rank)

    def run(self, rank: int, start: float, seconds: float) -> float:
        if not self.cores:
            return seconds
        seconds *= max(1.0, self._busy(rank, start) / self.cores)
        self.busy[rank] = (start, start + seconds)
        return seconds


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def step_flops(model, x, y) -> int:
    """Floating-point operations of one forward and backward of `model` on the minibatch
    (`x`, `y`), all moved to the meta device: nothing is computed."""
    from torch.utils.flop_counter import FlopCounterMode

    from stalebench.evaluation import objective

    model, x, y = model.to("meta"), x.to("meta"), y.to("meta")
    counter = FlopCounterMode(display=False)
    with counter:
        objective(model(x), y).backward()
    return int(counter.get_total_flops())


def tensor_flops(net, params, x) -> list[float]:
    """Each of `params`' part of `net`'s forward pass on the minibatch `x`, in FLOPs: those of
    the module that holds it (its own, less its children's), split among that module's
    tensors by size. Counted by torch's FLOP counter with every parameter and buffer
    swapped for a meta tensor of its shape, so nothing is computed or copied. A layer's
    backward costs about twice its forward (its input's gradient and its weights'), so the
    same parts time the backward pass. A model none of whose operations the counter knows,
    or that cannot run on the meta device (an operation without a meta kernel: the log says
    which), is timed by its tensors' sizes instead."""
    import torch
    from torch.func import functional_call
    from torch.utils.flop_counter import FlopCounterMode

    state = {name: torch.empty_like(t, device="meta")
             for name, t in [*net.named_parameters(), *net.named_buffers()]}  # fmt: skip
    counter = FlopCounterMode(display=False)
    try:
        with counter, torch.no_grad():
            functional_call(net, state, (x.to("meta"),))
    except Exception as exc:  # a plugin's operation without a meta kernel
        logging.getLogger("stalebench").warning(
            "the layers' FLOPs could not be counted on the meta device (%s: %s): a step's "
            "time is spread over its layers by their sizes",
            type(exc).__name__,
            exc,
        )
        return [float(p.numel()) for p in params]
    counts = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    root = type(net).__name__
    total = {
        id(m): counts.get(f"{root}.{fqn}" if fqn else root, 0) for fqn, m in net.named_modules()
    }
    index = {id(p): i for i, p in enumerate(params)}
    work = [0.0] * len(params)
    for module in net.modules():
        own = [p for p in module.parameters(recurse=False) if id(p) in index]
        if not own:
            continue
        flops = total[id(module)] - sum(total[id(c)] for c in module.children())
        size = sum(p.numel() for p in own)
        for p in own:
            work[index[id(p)]] = max(flops, 0) * p.numel() / size
    if not sum(work):
        return [float(p.numel()) for p in params]
    return work


def step_ms(flops: int, device: str, precision: str, utilization: float) -> float:
    """A step's mean time (ms) on `device`: its FLOPs at `utilization` of the peak."""
    return flops / (DEVICES[device].tflops[precision] * 1e12 * utilization) * 1000.0


def minibatch(cfg, splits):
    """A step's minibatch: the first `dataset.batch_size` training examples (x, y)."""
    n = min(cfg.dataset.batch_size, len(splits.y_train))
    return splits.x_train[:n], splits.y_train[:n]


def time_step(
    model, x, y, repeats: int, clock=time.perf_counter, opt=None, stat=statistics.median
) -> float:
    """A training step of `model` on (x, y) as measured here by `clock` (seconds): forward
    and backward, and `opt`'s step when given; `stat` (the median) of `repeats` after one
    to warm up."""
    from stalebench.evaluation import objective

    times = []
    for _ in range(repeats + 1):
        start = clock()
        (opt or model).zero_grad(set_to_none=True)
        objective(model(x), y).backward()
        if opt is not None:
            opt.step()
        times.append(clock() - start)
    return stat(times[1:])
