"""What both runtimes of the local engine share: a worker's replica and its inner steps, the
per-worker statistics a round exchanges, the wire format of a pseudo-gradient, when each
fragment of θ is sent and merged (`Plan`), the arithmetic that turns the exchange into the
next θ and the next replicas (`Exchange`), and the asynchronous server's (`Arrivals`).

A round of the collective modes, for every outer rule:

1. each worker takes H inner steps on its replica x_i (from θ, or where the rule left it);
2. the payload is all-reduced: Δ_i/M from every worker (`exchange = "mean"`), or, for a
   rule that follows leaders, Δ_l of each group's leader in that group's slot (the
   workers' losses all-reduced first, to pick the leaders); an int8 payload is
   all-gathered instead;
3. the round's statistics are all-reduced, exact (float64): `STATS` per worker (compute
   time, mean inner loss, seconds paused, ‖Δ_i‖, the wire's relative error) and when the
   worker's payload is through, as the network model has it (the latest of these decides
   the wall budget). They are the harness's measurement: free on the wire, in no bytes;
4. every worker applies the same arithmetic (`Exchange.new_theta`, `merge`), so θ stays
   identical everywhere.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from stalebench import precision
from stalebench.algorithms.local import INNER, OUTER, OuterRule
from stalebench.engines.common import GradientStep, Net
from stalebench.engines.local.wire import QUANTIZE
from stalebench.engines.rounds import ring_volume
from stalebench.job import Job
from stalebench.registry import stored

STATS = 5  # per worker: compute_s, loss, paused_s, delta_norm, wire_error; then its end
WIRES = dict(zip(QUANTIZE, (torch.float32, torch.float16, torch.int8), strict=True))


class Replica:
    """One worker: its replica x, inner optimizer, minibatches and BatchNorm statistics."""

    def __init__(self, job: Job, worker: int, theta: torch.Tensor, net: Net):
        self.worker, self.numerics = worker, job.numerics  # false: no inner step computed
        self.x = theta.clone()
        self.inner = INNER.build(job.cfg.algorithm.inner, self.x)
        self.batches = job.batches(worker)
        self.buffers = [b.detach().clone() for b in net.buffers]
        self.scale = precision.loss_scale(net.device)  # fp16: its own loss scale

    def step(self, net: Net) -> GradientStep:
        """One inner step on the next minibatch, as a step (`World.compute`): the gradient
        at x, then the optimizer; its result the minibatch's loss."""
        return GradientStep(net, self.x, self.buffers, self.batches, None, self._inner,
                            self.scale)  # fmt: skip

    def _inner(self, grad: torch.Tensor, loss: float) -> float:
        if self.numerics:
            self.inner.step(grad)
        return loss


@stored
class Wire:
    """How a pseudo-gradient travels: as float32 (`none`, bit-exact), cast to float16 and
    summed in it by the all-reduce (`fp16`), or as int8 with one float32 scale per model
    tensor (`int8`: each tensor's max |value| maps to 127), which no all-reduce can sum:
    every worker's int8 Δ is all-gathered and the sum taken after decoding.

    `segments`: the model tensors' ranges within the vector it carries (the scales' ranges).
    """

    def __init__(self, name: str, segments: list[tuple[int, int]]):
        self.name, self.dtype, self.segments = name, WIRES[name], segments
        self.gathers = self.dtype == torch.int8

    def nbytes(self, numel: int) -> int:
        """Bytes of one encoded vector of `numel` values."""
        if self.gathers:
            return numel + 4 * len(self.segments)
        return numel * torch.empty(0, dtype=self.dtype).element_size()

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        if self.dtype == torch.float32:
            return x
        if not self.gathers:
            return x.to(self.dtype)
        q = torch.empty(x.numel(), dtype=torch.int8, device=x.device)
        scales = torch.empty(len(self.segments), device=x.device)
        for k, (a, b) in enumerate(self.segments):
            top = float(x[a:b].abs().max()) if b > a else 0.0
            scales[k] = top / 127 if top > 0 else 1.0
            q[a:b] = torch.round(x[a:b] / scales[k]).clamp_(-127, 127).to(torch.int8)
        return torch.cat([q, scales.view(torch.int8)])

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        if self.dtype == torch.float32:
            return x
        if not self.gathers:
            return x.float()
        d = x.numel() - 4 * len(self.segments)
        out, scales = x[:d].float(), x[d:].clone().view(torch.float32)
        for k, (a, b) in enumerate(self.segments):
            out[a:b] *= scales[k]
        return out

    def error(self, x: torch.Tensor) -> float:
        """‖decode(encode(x)) − x‖ / ‖x‖: what the wire alone loses of x (0 when exact)."""
        norm = float(x.norm())
        if self.dtype == torch.float32 or norm == 0.0:
            return 0.0
        return float((self.decode(self.encode(x)) - x).norm()) / norm


def segments(sizes: list[int], part: slice) -> list[tuple[int, int]]:
    """The ranges of tensors of `sizes` (laid end to end) within `part`, relative to it."""
    out, start = [], 0
    for n in sizes:
        a, b = max(start, part.start), min(start + n, part.stop)
        if a < b:
            out.append((a - part.start, b - part.start))
        start += n
    return out


class Plan:
    """When each fragment of θ is sent and merged, in inner steps counted from 1.

    θ is cut into `fragments` contiguous, near-equal ranges of the flat vector. Fragment p
    is sent every H steps at offset ((p + 1)·H/P) mod H (P = 1: every H-th step) and
    merged `delay` steps after it was sent (τ = 0: at once; τ > 0: the merges of earlier
    sends come before the step's sends). `sync` is P = 1, τ = 0; `streaming` Streaming
    DiLoCo's staggered fragments; `overlap` HPSGD's one fragment merged a whole round later
    (τ = H), the replica keeping the steps it took meanwhile on top of the new θ."""

    def __init__(self, mode: str, steps: int, fragments: int, delay: int, num_params: int):
        self.mode, self.steps = mode, steps
        self.fragments = 1 if mode != "streaming" else fragments
        self.delay = {"sync": 0, "overlap": steps}.get(mode, delay)
        p, d = self.fragments, num_params
        self.bounds = [d * k // p for k in range(p + 1)]
        self.offsets = [(k + 1) * steps // p % steps for k in range(p)]

    def part(self, p: int) -> slice:
        return slice(self.bounds[p], self.bounds[p + 1])

    def sends(self, step: int) -> list[int]:
        return [p for p, off in enumerate(self.offsets) if step % self.steps == off]

    def merges(self, step: int) -> list[int]:
        sent = step - self.delay
        return self.sends(sent) if sent >= 1 else []

    @property
    def keeps_progress(self) -> bool:
        """overlap: the replica keeps its steps since the send and adds θ's change."""
        return self.mode == "overlap"


@stored
class Exchange:
    """One round's arithmetic (of one fragment of θ), the same on every worker and in the
    simulator."""

    def __init__(self, job: Job, theta: torch.Tensor, wire: Wire):
        a, m = job.cfg.algorithm, job.num_workers
        self.rule: OuterRule = OUTER.build(a.outer, theta, m)
        self.num_workers, self.wire, self.d = m, wire, theta.numel()
        self.gathers = wire.gathers  # int8: the payload is all-gathered, not all-reduced
        self.slots = len(self.rule.groups()) if self.rule.exchange == "leaders" else 1
        self.leaders: list[int] = []
        self.best = 0

    def volume(self) -> int:
        """Bytes all workers together send in the round's collectives (the statistics are
        the harness's, not counted): 2(M − 1) times the message for a ring all-reduce,
        M(M − 1) pieces for a ring all-gather, and a leader rule's losses (float64 each)."""
        m = self.num_workers
        losses = ring_volume(8 * m, m) if self.rule.exchange == "leaders" else 0
        if self.gathers:
            return losses + m * (m - 1) * self.payload_bytes
        return losses + ring_volume(self.payload_bytes, m)

    @property
    def payload_bytes(self) -> int:
        """One worker's payload (int8: its own piece of the all-gather)."""
        return self.slots * self.wire.nbytes(self.d)

    def choose(self, losses: list[float]) -> None:
        """Before the payload: a rule that follows leaders picks them from the losses."""
        if self.rule.exchange == "leaders":
            self.leaders, self.best = self.rule.leaders(losses)

    def contribution(self, worker: int, delta: torch.Tensor) -> torch.Tensor:
        """What `worker` puts into the payload all-reduce (in the wire's type); in a
        cost-only run (Δ on the meta device) its bytes without values."""
        if delta.is_meta:
            return torch.empty(self.payload_bytes, dtype=torch.uint8, device="meta")
        if self.gathers:
            return self.wire.encode(delta)
        if self.rule.exchange == "mean":
            return self.wire.encode(delta / self.num_workers)
        out = torch.zeros(self.slots, self.d, dtype=self.wire.dtype, device=delta.device)
        if worker in self.leaders:
            out[self.leaders.index(worker)] = self.wire.encode(delta)
        return out

    def gathered(self, pieces: list[torch.Tensor]) -> torch.Tensor:
        """The mean Δ from every worker's int8 piece, decoded and summed in rank order."""
        total = self.wire.decode(pieces[0])
        for piece in pieces[1:]:
            total += self.wire.decode(piece)
        return total.div_(self.num_workers)

    def new_theta(self, theta: torch.Tensor, total, share: float = 1.0) -> torch.Tensor | None:
        """θ ← the outer step (in place) from the summed payload (int8: the gathered
        pieces); returns the leaders' replicas (rows), or None. `share`: M / the replicas
        the payload summed, when some were lost (a mean over those left)."""
        summed = self.gathered(total) if self.gathers else self.wire.decode(total)
        summed = summed.to(theta.device, non_blocking=True)  # from the wire to θ's device
        if share != 1.0:
            summed.mul_(share)
        if self.rule.exchange == "mean":
            self.rule.step(theta, summed)
            return None
        leaders = theta.unsqueeze(0) - summed.view(self.slots, self.d)
        theta.copy_(leaders[self.best])
        return leaders

    def new_replica(
        self, x: torch.Tensor, delta: torch.Tensor, theta: torch.Tensor, leaders, worker: int
    ) -> None:
        """This worker's replica for the next round."""
        if leaders is None:
            self.rule.replica(x, delta, theta)
        else:
            self.rule.pull(x, worker, self.leaders, self.best, leaders)

    def merge(
        self, x: torch.Tensor, delta: torch.Tensor, theta: torch.Tensor, leaders, worker: int,
        before: torch.Tensor | None, alpha: float,
    ) -> None:  # fmt: skip
        """Merge the new θ into replica x, which may have taken steps since it sent Δ:
        with `before` (θ at the send; overlap) the steps since the send are kept on top of
        the new θ: x ← θ + (x − x_sent), x_sent = before − Δ; otherwise the rule's replica,
        mixed with the current x by `alpha` (Streaming DiLoCo's α: x ← (1 − α)·replica +
        α·x; 0 takes the rule's replica as it is)."""
        if before is not None:
            x.add_(theta - before).add_(delta)
            return
        old = x.clone() if alpha else None
        self.new_replica(x, delta, theta, leaders, worker)
        if old is not None:
            x.mul_(1 - alpha).add_(old, alpha=alpha)


def stats_row(compute_s: float, loss: float, paused_s: float, delta: torch.Tensor, wire: Wire):
    """A worker's statistics of a round; Δ's norm and the wire's error NaN in a cost-only
    run (Δ on the meta device: their events leave them out)."""
    if delta.is_meta:
        return [compute_s, loss, paused_s, math.nan, math.nan]
    return [compute_s, loss, paused_s, float(delta.norm()), wire.error(delta)]


def update_event(
    worker: int, version: int, row: list[float], slowest: float, comm_s: float, steps: int,
    nbytes: int,
) -> dict[str, Any]:  # fmt: skip
    """An `update` event's fields for one worker's part of the round that made `version`;
    `slowest`: the longest compute + pause of the round (the others wait for it)."""
    compute, loss, paused, norm, err = row
    return dict(
        worker=worker, clock=version - 1, version=version, lag=0, loss=loss, compute_s=compute,
        wait_s=slowest - compute - paused, comm_s=comm_s, clock_gap=0, inner_steps=steps,
        paused_s=paused, delta_norm=norm, wire_error=err, bytes=nbytes,
    )  # fmt: skip


def report(
    emit, t: float, version: int, rows: list[list[float]], comm_s: float, steps: int,
    nbytes: int, workers: list[int] | None = None,
) -> None:  # fmt: skip
    """The round's events: each pause a fault caused, then every worker's update (`rows`:
    those of `workers`, by default all)."""
    slowest = max(r[0] + r[2] for r in rows)
    workers = workers if workers is not None else list(range(len(rows)))
    for w, row in zip(workers, rows, strict=True):
        if row[2] > 0:
            emit("worker", t, worker=w, event="pause", duration_s=row[2])
    for w, row in zip(workers, rows, strict=True):
        emit("update", t, **update_event(w, version, row, slowest, comm_s, steps, nbytes))


class Arrivals:
    """The asynchronous server's arithmetic (engine.mode=async), the same in both runtimes:
    each worker's Δ is applied by the outer rule the moment it arrives, as that worker's
    1/M share of a round (θ ← outer step with Δ_i/M), and its lag is the outer steps since
    the θ it started from. With `dynamic` (dynamic local updates), a worker's next H is
    H·(its steps/s)/(the fastest worker's), at least 1, from the speeds measured so far."""

    def __init__(self, job: Job, theta: torch.Tensor):
        a, e = job.cfg.algorithm, job.cfg.engine
        self.num_workers = job.num_workers
        self.rule: OuterRule = OUTER.build(a.outer, theta, self.num_workers)
        self.theta, self.steps, self.dynamic = theta, a.outer.inner_steps, e.dynamic_local
        self.version = 0
        self.speed: dict[int, float] = {}

    def apply(self, worker: int, delta, read: int, steps: int, compute_s: float):
        """Apply one arrival (`delta` None: a cost-only run's, which has no values);
        returns its lag."""
        if delta is not None:
            self.rule.step(self.theta, delta / self.num_workers)
        lag, self.version = self.version - read, self.version + 1
        if compute_s > 0:
            self.speed[worker] = steps / compute_s
        return lag

    def next_steps(self, worker: int) -> int:
        """H for the worker's next round."""
        if not self.dynamic or worker not in self.speed:
            return self.steps
        return max(1, round(self.steps * self.speed[worker] / max(self.speed.values())))

    def replica(self, x: torch.Tensor, delta: torch.Tensor) -> None:
        """A worker's replica once θ reaches it (its own Δ, as it computed it)."""
        self.rule.replica(x, delta, self.theta)


# engine.mode=async on the wire: a push is a float32 header then the wire's Δ; a reply a
# float32 header then θ
HEADER = 9  # push: kind, clock, version read, steps, compute_s, loss, paused_s, rtt_s, error
REPLY = 4  # reply: kind, version, next H, (unused)
PUSH, PARAMS, STOP = 1.0, 2.0, 3.0


def reply_bytes(num_params: int) -> int:
    return 4 * (REPLY + num_params)


def async_event(
    worker: int, clock: int, version: int, lag: int, stats: list[float], steps: int,
    comm_s: float, nbytes: int,
) -> dict[str, Any]:  # fmt: skip
    """An `update` event's fields for one arrival; `stats`: compute_s, loss, paused_s,
    ‖Δ‖, the wire's error."""
    compute, loss, paused, norm, err = stats
    return dict(
        worker=worker, clock=clock, version=version, lag=lag, loss=loss, compute_s=compute,
        wait_s=0.0, comm_s=comm_s, clock_gap=0, inner_steps=steps, paused_s=paused,
        delta_norm=norm, wire_error=err, bytes=nbytes,
    )  # fmt: skip
