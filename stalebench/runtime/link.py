"""Communication that overlaps computation, for an engine that all-reduces a round's
gradient in pieces while backward is still making the rest (DDP's buckets, P3's slices).

`Link` starts the pieces' all-reduces asynchronously (gloo runs them on its own threads,
without the interpreter lock) in one order fixed at start-up: every rank must issue the same
collectives in the same order. The emulated network is a clock: a process group carries one
collective at a time, so a piece's ring all-reduce (`Network.allreduce_s`) starts once it is
issued and the previous piece is through, and `wait` returns no sooner than it ends (nor
before the real all-reduce is done). `LinkClock` (`runtime/faults.py`, where `Shaped` paces
every collective with it) is that arithmetic alone, for a reference that issues its own
collectives (DDP).

`Pace` spreads the profile's step time over the step, so that what overlaps with
communication is the modelled computation, not a sleep after it: each module with
parameters lasts at least its share of the forward pass (⅓ of the step), each parameter's
gradient comes at least its share of the backward pass (⅔) after the one before; a share is
its part of the step's computation (`work`: its layer's FLOPs, `runtime.compute.tensor_flops`,
as the simulator's `Layout` has it), or by default its fraction of the parameters.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from stalebench.runtime.faults import LinkClock, Shaped, pad_to
from stalebench.runtime.transport import Pending

if TYPE_CHECKING:
    from stalebench.runtime.collectives import Sharded

FORWARD = 1 / 3  # the forward pass's share of a step; backward takes the rest


class Link:
    """The all-reduces of a round's pieces `bufs`, issued in `order`: `post(i, r)` says piece
    i of round r is written (it is issued once every piece before it in the order is),
    `wait(i)` returns once its sum is in, in the emulated network too: each piece a ring
    (or the transport's algorithm) one after another, or under a sharded parameter server
    (`cluster.collective=sharded_ps`) pushed to and pulled from the servers holding its
    tensors (`spans`, as the simulator's `Layout` has them), the NICs booked afresh each
    round (`Network.servers`, the simulator's model a piece at a time)."""

    def __init__(self, network: Shaped, bufs: Sequence[torch.Tensor], order: Sequence[int],
                 spans=None):  # fmt: skip
        self.network, self.bufs, self.order = network, list(bufs), list(order)
        self.spans = spans
        self.clock = LinkClock(network.network)
        self.servers: Sharded | None = None  # this round's servers' NICs (`Network.servers`)
        self.made = [0] * len(bufs)  # the last round each piece was written for
        self.next = 0  # the position in `order` of the next piece to issue
        self.pending: list[Pending | None] = [None] * len(bufs)
        self.ends = [0.0] * len(bufs)
        self.seconds = [0.0] * len(bufs)  # each piece's modelled all-reduce, this round

    def post(self, piece: int, round_: int) -> None:
        self.made[piece] = round_
        net, slow_s = self.network.network, self.network.slow_s
        while self.next < len(self.order) and self.made[self.order[self.next]] == round_:
            k = self.order[self.next]
            nbytes = 4 * self.bufs[k].numel()
            if self.next == 0:  # a round's first piece: its servers' NICs unbooked
                self.servers = net.servers()
            if self.servers is not None:
                now, held = time.perf_counter(), self.spans[k] if self.spans else None
                self.ends[k] = self.servers.end(k, nbytes, now, slow_s, held)
                self.seconds[k] = self.ends[k] - now
            else:
                self.seconds[k] = net.allreduce_s(nbytes, slow_s)
                self.ends[k] = self.clock.after(self.seconds[k])
            self.pending[k] = self.network.inner.all_reduce_start(self.bufs[k])
            self.next += 1
        if self.next == len(self.order):
            self.next = 0

    def wait(self, piece: int) -> None:
        pending = self.pending[piece]
        if pending is not None:
            self.pending[piece] = None
            pending.wait()
            self.network.waits.until(self.ends[piece], self.seconds[piece])

    def close(self) -> None:
        """Wait for what is still under way (every rank issued it)."""
        for piece in range(len(self.bufs)):
            self.wait(piece)


class Pieces:
    """`World.pieces` in real processes: a `Link` over the rank's network (its faults slow
    each piece), and the seconds this rank waited for pieces (`waited`)."""

    hooked = True  # a step's backward hooks post the pieces as they are made

    def __init__(self, network: Shaped, buf: torch.Tensor, bounds, order: Sequence[int],
                 spans=None):  # fmt: skip
        self.link = Link(network, [buf[a:b] for a, b in bounds], order, spans)
        self.waited = 0.0

    def post(self, piece: int, round_: int) -> None:
        self.link.post(piece, round_)

    def wait(self, piece: int) -> None:
        start = time.perf_counter()
        self.link.wait(piece)
        self.waited += time.perf_counter() - start

    def settle(self):
        """Every piece of the round (an op of the rank's program); the seconds waited."""
        before = self.waited
        for piece in range(len(self.link.bufs)):
            self.wait(piece)
        return self.waited - before
        yield  # unreachable: an op that never suspends

    def close(self) -> None:
        self.link.close()


class Pace:
    """Hooks on `net` that make a step last the step time given to `start`, spread as the
    module docstring says; `backward()` marks the end of the forward pass. Register hooks
    that must run before a module's paced forward (a wait for its parameters) before this,
    and gradient hooks that must see the paced gradient after it."""

    def __init__(
        self,
        net: torch.nn.Module,
        params: Sequence[torch.Tensor],
        work: Sequence[float] | None = None,
    ):
        work = [float(p.numel()) for p in params] if work is None else list(work)
        total, of = sum(work), {id(p): w for p, w in zip(params, work, strict=True)}
        self.step_s, self.mark = 0.0, 0.0
        self.began: dict[int, float] = {}
        for module in net.modules():
            own = [p for p in module.parameters(recurse=False) if id(p) in of]
            if own:
                module.register_forward_pre_hook(self._begin)
                share = sum(of[id(p)] for p in own) / total
                module.register_forward_hook(self._ender(FORWARD * share))
        for p in params:
            p.register_hook(self._arrive(of[id(p)] / total))

    def start(self, step_s: float) -> None:
        self.step_s = step_s

    def backward(self) -> None:
        self.mark = time.perf_counter()

    def _begin(self, module, args) -> None:
        self.began[id(module)] = time.perf_counter()

    def _ender(self, share: float):
        def end(module, args, out) -> None:
            pad_to(self.began[id(module)], share * self.step_s)

        return end

    def _arrive(self, share: float):
        def arrive(grad: torch.Tensor) -> None:
            pad_to(self.mark, (1 - FORWARD) * share * self.step_s)
            self.mark = time.perf_counter()

        return arrive
