"""engine=allreduce with `engine.bucket_mb > 0`: the round's gradient all-reduced in pieces
while backward is still making the rest, as DDP does (`schedule=fifo`), or in P3's finer
slices sent by priority and applied layer by layer as the next forward pass reaches them
(`schedule=p3`, Jayarajan et al., MLSys 2019), so the communication overlaps the next
iteration's computation too.

Both are BSP: round r's update is the mean of the N gradients of round r, applied by the
configured rule, exactly as the one-message round; only when the pieces travel changes.
`Layout` cuts the buffer; the world all-reduces its pieces (`World.pieces`: in real
processes in one order fixed at start-up, the same on every rank, as backward hooks post
them, with `World.pace` spreading the profile's step time over forward and backward so that
what the pieces overlap is the modelled computation; on the virtual clock as one all-reduce
lasting what the pieces would). `Rounds` holds a replica's side of it, for the replica's
one role (stalebench.engines.allreduce.replica.Replica).
"""

from __future__ import annotations

import dataclasses
import functools
import time

import torch
from torch.nn.utils import parameters_to_vector

from stalebench import precision
from stalebench.algorithms.base import UPDATES
from stalebench.evaluation import objective
from stalebench.job import Job
from stalebench.models.nets import flatten_parameters
from stalebench.runtime.compute import minibatch, tensor_flops
from stalebench.runtime.link import FORWARD
from stalebench.runtime.network import Network
from stalebench.runtime.record import gradient
from stalebench.runtime.world import Op


@dataclasses.dataclass(frozen=True)
class Layout:
    """A round's buffer: a tail of 3·N + 1 slots (each rank's compute time, loss and seconds
    paused, then the stop flag), then θ's gradient; `pieces` are (lo, hi) ranges of it in
    θ's order. The piece that holds θ's first element also carries the tail, so the round's
    statistics travel with the last gradient backward makes, at no extra message."""

    tail: int
    offsets: tuple[int, ...]  # each parameter tensor's first slot
    sizes: tuple[int, ...]
    pieces: tuple[tuple[int, int], ...]
    # each tensor's part of the step's computation (`runtime.compute.tensor_flops`: its
    # layer's FLOPs); by default its size (a linear layer's FLOPs are its weights')
    work: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.work:
            object.__setattr__(self, "work", tuple(float(s) for s in self.sizes))

    @classmethod
    def build(
        cls, sizes: list[int], num_workers: int, piece: int, p3: bool, work: list[float] = ()
    ) -> Layout:
        """fifo: buckets of whole tensors, filled from the last tensor back (the order
        backward makes them), closed once they hold `piece` elements; p3: every tensor cut
        into slices of at most `piece` elements, neighbouring slices merged while they fit
        in one (a layer's bias travels with its weights: a piece pays a latency). `work`:
        each tensor's part of the step's computation (default: its size)."""
        tail = 3 * num_workers + 1
        offsets = [tail + sum(sizes[:i]) for i in range(len(sizes))]
        end = tail + sum(sizes)
        if p3:
            slices = sorted(
                {o + k for o, s in zip(offsets, sizes, strict=True) for k in range(0, s, piece)}
            )
            cuts = {tail}  # neighbouring slices of small tensors share a piece up to `piece`
            for prev, b in zip(slices, [*slices[1:], end], strict=True):
                if b - max(cuts) > piece and prev > max(cuts):
                    cuts.add(prev)
        else:
            cuts, held = set(), 0
            for i in reversed(range(len(sizes))):
                held += sizes[i]
                if held >= piece or i == 0:
                    cuts.add(offsets[i])
                    held = 0
        bounds = [*sorted(cuts - {tail}), end]
        pieces = tuple(zip([0, *bounds[:-1]], bounds, strict=True))
        return cls(tail, tuple(offsets), tuple(sizes), pieces, tuple(work))

    @property
    def size(self) -> int:
        return self.pieces[-1][1]

    def holding(self, i: int) -> list[int]:
        """The pieces that hold part of parameter tensor i."""
        return self.holders[i]

    @functools.cached_property
    def holders(self) -> list[list[int]]:
        """`holding(i)` for every tensor, worked out once (a backward hook asks for it)."""
        spans = [(o, o + s) for o, s in zip(self.offsets, self.sizes, strict=True)]
        return [
            [k for k, (a, b) in enumerate(self.pieces) if a < hi and b > lo] for lo, hi in spans
        ]

    @functools.cached_property
    def spans(self) -> list[list[tuple[int, int, int, int]]]:
        """The tensors each piece holds: (tensor, first element, end, its elements)."""
        spans: list[list[tuple[int, int, int, int]]] = [[] for _ in self.pieces]
        for i, (o, s) in enumerate(zip(self.offsets, self.sizes, strict=True)):
            for k in self.holding(i):
                a, b = self.pieces[k]
                spans[k].append((i, max(a, o) - o, min(b, o + s) - o, s))
        return spans

    def travel(self, kept: frozenset[int]) -> list[int]:
        """The bytes each piece carries when the tensors `kept` stay on their rank."""
        left = [4 * (b - a) for a, b in self.pieces]
        for i, t, lo, hi, _ in ((i, *span) for i, spans in enumerate(self.spans) for span in spans):
            if t in kept:
                left[i] -= 4 * (hi - lo)
        return left

    def span(self, k: int) -> tuple[int, int]:
        """Piece k's range of θ (its tail slots left out)."""
        lo, hi = self.pieces[k]
        return max(lo, self.tail) - self.tail, hi - self.tail

    def ready_at(self) -> list[float]:
        """When, in steps, backward has made each piece (`Pace`'s model: the forward pass
        takes FORWARD of a step, each tensor's gradient its share of the rest by `work`,
        from the last tensor back; the tail is written at the end)."""
        total, made, at = sum(self.work), 0.0, {}
        for i in reversed(range(len(self.sizes))):
            made += self.work[i]
            at[i] = FORWARD + (1 - FORWARD) * made / total
        return [
            1.0 if k == 0 else max(at[i] for i in range(len(self.sizes)) if k in self.holding(i))
            for k in range(len(self.pieces))
        ]

    def forward(self, modules: list[list[int]]) -> list[tuple[float, list[int]]]:
        """Each module's share of a step in the forward pass (`Pace`'s model: FORWARD of
        the step, by its tensors' `work`) and the pieces holding its tensors, in forward
        order; `modules`: each module's parameter tensors, in that order."""
        total = sum(self.work)
        return [
            (FORWARD * sum(self.work[i] for i in own) / total,
             sorted({k for i in own for k in self.holding(i)}))
            for own in modules
        ]  # fmt: skip

    def order(self, network: Network, step_s: float, p3: bool) -> list[int]:
        """The order every rank all-reduces the pieces in. fifo: as backward makes them.
        p3: the link's priority schedule (`Network.priority_order`), replayed on the network
        model for pieces ready at `ready_at` × `step_s`, so that all ranks agree on it."""
        ready = [r * step_s for r in self.ready_at()]
        if not p3:
            return sorted(range(len(ready)), key=lambda k: (ready[k], -k))
        return network.priority_order([4 * (b - a) for a, b in self.pieces], ready)


class Rounds:
    """One replica's rounds in pieces (`engine.bucket_mb` > 0) over `World.pieces`: the
    buffer's layout (`Layout`) and, where a step's backward hooks are heard (real
    processes), the hooks that post each piece when backward has made it and under P3
    apply the last round's pieces as the forward pass reaches them, the paced step that
    fires them, and the update once a round's pieces are in."""

    def __init__(self, job: Job, world, gradient_step, params, rule, nominal: float, msg,
                 grad_in: torch.Tensor | None = None,
                 kept: frozenset[int] = frozenset()):  # fmt: skip
        eng, n, net = job.cfg.engine, job.num_workers, gradient_step.net.model
        self.p3, self.n = eng.schedule == "p3", n
        self.net_params = net_params = list(net.parameters())
        sizes = [p.numel() for p in net_params]
        piece = max(1, int(eng.bucket_mb * 2**20 / 4))
        # the step's computation, layer by layer: every replica's model is the job's, so
        # the simulator's replicas count it once (0.5 s for ResNet-50)
        x, _ = minibatch(job.cfg, job.splits)
        work = world.shared("layer work", lambda: tensor_flops(net, net_params, x))
        self.layout = layout = Layout.build(sizes, n, piece, self.p3, work)
        if msg.slots != layout.size:  # a `runtime.wire.Message`
            raise ValueError(f"a round's message of {msg.slots} slots for {layout.size}")
        self.buf = msg.buf  # the tail, then θ's gradient (the step's `out` where not hooked)
        self.params, self.rule, self.batches = params, rule, gradient_step.batches
        self.grad_in = grad_in  # θ on a GPU: where a piece of the mean is copied up to
        self.device = world.device
        self.round, self.step_s = 0, 0.0  # the round being computed, its modelled step time
        self.mark = 0.0  # seconds waited for pieces before the round began
        self.applied = [0] * len(layout.pieces)  # the last round each piece was applied for
        index = {id(p): i for i, p in enumerate(net_params)}
        self.left_in = [0] * len(layout.pieces)  # tensors (and the tail) still to come
        for i in range(len(sizes)):
            for k in layout.holding(i):
                self.left_in[k] += 1
        self.left_in[0] += 1
        self.fresh = list(self.left_in)
        order = layout.order(world.network, nominal, self.p3)
        owners = [(m, [index[id(p)] for p in m.parameters(recurse=False)]) for m in net.modules()]
        owners = [(m, own) for m, own in owners if own]  # each waits for its tensors, then runs
        forward = layout.forward([own for _, own in owners]) if self.p3 else None  # virtual P3
        sizes = layout.travel(kept) if kept else None  # model-parallel tensors stay
        spans = [[span for span in piece if span[0] not in kept] for piece in layout.spans]
        self.pieces = world.pieces(
            self.buf, list(layout.pieces), order, layout.ready_at(), forward, spans, sizes
        )
        if not self.pieces.hooked:
            return
        if self.p3:
            for module, own in owners:
                module.register_forward_pre_hook(lambda m, a, own=own: self.apply(own))
        # after P3's waits, before the gradient hooks
        self.pace = world.pace(net, net_params, layout.work)
        for i, p in enumerate(net_params):
            p.register_hook(lambda g, i=i: self.made(i, g))
        self.net = net

    def next_round(self, step_s: float) -> torch.Tensor | None:
        """A new round of `step_s` modelled seconds. Under P3 from the second round on: the
        round before's tail waited for (its word in the buffer), its statistics returned —
        the round closes once the next forward pass has applied it — and `mark` set to the
        seconds waited before it; else None."""
        self.round, self.step_s, self.mark = self.round + 1, step_s, self.pieces.waited
        if not self.p3 or self.round == 1 or not self.pieces.hooked:
            return None
        self.pieces.wait(0)
        return self.buf[: 3 * self.n].view(self.n, 3).clone()

    def step(self) -> float:
        """A hooked step (`World.compute`): the forward pass (under P3 applying the round
        before by layer, then what it did not reach), backward posting the pieces as it
        makes them; the loss."""
        self.pace.start(self.step_s)
        x, y = next(self.batches)
        with precision.autocast(self.device):  # bf16: the forward pass in bfloat16
            loss = objective(self.net(x.to(self.device)), y.to(self.device))
        if self.p3 and self.round > 1:
            self.apply(list(range(len(self.net_params))))
            self.rule.count()
        self.pace.backward()
        torch.autograd.grad(loss, self.net_params)  # the hooks post the pieces as they are made
        return loss.item()

    def made(self, i: int, grad: torch.Tensor) -> None:
        """Backward has made tensor i's gradient: into the buffer; post what it completes."""
        lo = self.layout.offsets[i]
        self.buf[lo : lo + self.layout.sizes[i]].copy_(grad.reshape(-1))
        for k in self.layout.holding(i):
            self.one_less(k)

    def one_less(self, k: int) -> None:
        self.left_in[k] -= 1
        if self.left_in[k] == 0:
            self.pieces.post(k, self.round)

    def header_written(self) -> None:
        """Backward is done and the tail written: it completes piece 0."""
        if self.pieces.hooked:
            self.one_less(0)
            self.left_in = list(self.fresh)

    def apply(self, tensors: list[int]) -> None:
        """P3: the previous round's pieces of these tensors, applied (waited for first)."""
        done = self.round - 1
        if done < 1:
            return
        for i in tensors:
            for k in self.layout.holding(i):
                if self.applied[k] < done:
                    self.pieces.wait(k)
                    lo, hi = self.layout.span(k)
                    grad = self.buf[self.layout.tail :]
                    grad[lo:hi].div_(self.n)
                    if self.grad_in is not None:  # up to θ's device
                        self.grad_in[lo:hi].copy_(grad[lo:hi], non_blocking=True)
                        grad = self.grad_in
                    self.rule.apply_part(self.params, grad, lo, hi)
                    self.applied[k] = done


def measure_step(job: Job, world, net, net_params) -> Op[float]:
    """The step time the P3 order is planned for, the same on every rank: the profile's mean
    step time, or with no modelled compute rank 0's measured step (a warm-up)."""
    if job.profile.cfg.compute_ms > 0:
        return job.profile.cfg.compute_ms / 1000.0
    device, sample = net_params[0].device, (job.splits.x_train[:32], job.splits.y_train[:32])
    gradient(net, net_params, sample, device)
    start = time.perf_counter()
    gradient(net, net_params, sample, device)
    seconds = torch.tensor([time.perf_counter() - start if world.rank == 0 else 0.0])
    yield from world.all_reduce(seconds, 0.0)
    return float(seconds[0])


def build_replica(job: Job, device: torch.device):
    """(θ₀'s model, θ, the update rule, the replica's net, its parameter tensors): θ, the
    rule's state and the net on `device`, the net's parameters views of θ, so an update
    needs no copy."""
    model = job.model(shared=True)  # cost-only: nothing is written into it (`Replica.join`)
    params = parameters_to_vector(model.parameters()).detach().clone().to(device)
    rule = UPDATES.build(job.cfg.algorithm.update, params, job.num_workers)
    rule.set_shapes([p.shape for p in model.parameters()])  # a torch optimizer: DDP's tensors
    if not job.numerics:  # a cost-only run's θ has no values: θ₀'s meta model, one for
        return model, params, rule, model, list(model.parameters())  # every rank, is the net
    net = job.model().to(device)
    flatten_parameters(net, params)
    return model, params, rule, net, list(net.parameters())
