"""engine=allreduce with `engine.bucket_mb > 0`: the round's gradient all-reduced in pieces
while backward is still making the rest, as DDP does (`schedule=fifo`), or in P3's finer
slices sent by priority and applied layer by layer as the next forward pass reaches them
(`schedule=p3`, Jayarajan et al., MLSys 2019), so the communication overlaps the next
iteration's computation too.

Both are BSP: round r's update is the mean of the N gradients of round r, applied by the
configured rule, exactly as the one-message round; only when the pieces travel changes.
`Layout` cuts the buffer; `Link` (stalebench.runtime.link) all-reduces its pieces in one
order fixed at start-up, the same on every rank; `Pace` spreads the profile's step time over
forward and backward so that what the pieces overlap is the modelled computation.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from pathlib import Path
from typing import Any

import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from stalebench.algorithms.base import UPDATES
from stalebench.cluster import Profile
from stalebench.engines.rounds import close_round, ring_volume
from stalebench.evaluation import objective
from stalebench.job import Job
from stalebench.models.nets import flatten_parameters
from stalebench.runtime.faults import Faults, Shaped, WorkerDied
from stalebench.runtime.link import FORWARD, Link, Pace
from stalebench.runtime.record import RunRecord, gradient
from stalebench.runtime.transport import Transport


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

    @classmethod
    def build(cls, sizes: list[int], num_workers: int, piece: int, p3: bool) -> Layout:
        """fifo: buckets of whole tensors, filled from the last tensor back (the order
        backward makes them), closed once they hold `piece` elements; p3: every tensor cut
        into slices of at most `piece` elements, neighbouring slices merged while they fit
        in one (a layer's bias travels with its weights: a piece pays a latency)."""
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
        return cls(tail, tuple(offsets), tuple(sizes), pieces)

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

    def span(self, k: int) -> tuple[int, int]:
        """Piece k's range of θ (its tail slots left out)."""
        lo, hi = self.pieces[k]
        return max(lo, self.tail) - self.tail, hi - self.tail

    def ready_at(self) -> list[float]:
        """When, in steps, backward has made each piece (`Pace`'s model: the forward pass
        takes FORWARD of a step, each tensor's gradient its share of the rest, from the last
        tensor back; the tail is written at the end)."""
        total, made, at = sum(self.sizes), 0, {}
        for i in reversed(range(len(self.sizes))):
            made += self.sizes[i]
            at[i] = FORWARD + (1 - FORWARD) * made / total
        return [
            1.0 if k == 0 else max(at[i] for i in range(len(self.sizes)) if k in self.holding(i))
            for k in range(len(self.pieces))
        ]

    def order(self, profile: Profile, step_s: float, p3: bool) -> list[int]:
        """The order every rank all-reduces the pieces in. fifo: as backward makes them.
        p3: whenever the link is free, the made piece nearest the input first, replayed on
        the model (pieces ready at `ready_at` × `step_s`, each taking the profile's ring
        all-reduce time), so that all ranks agree on it."""
        ready = [r * step_s for r in self.ready_at()]
        if not p3:
            return sorted(range(len(ready)), key=lambda k: (ready[k], -k))
        cost = [profile.allreduce_s(4 * (b - a)) for a, b in self.pieces]
        order, t, left = [], 0.0, set(range(len(ready)))
        while left:
            made = [k for k in left if ready[k] <= t]
            if not made:
                t = min(ready[k] for k in left)
                continue
            order.append(min(made))
            left.remove(order[-1])
            t += cost[order[-1]]
        return order


class Rounds:
    """One replica's rounds in pieces: the hooks that post each piece when backward has
    made it (and under P3 apply the last round's pieces as the forward pass reaches them),
    and the update once a round's pieces are in."""

    def __init__(self, job: Job, rank: int, net, net_params, params, rule, network: Shaped):
        eng, n = job.cfg.engine, job.num_workers
        self.p3, self.n, self.rank = eng.schedule == "p3", n, rank
        nominal = measure_step(job, rank, net, net_params, network)  # before any hook
        sizes = [p.numel() for p in net_params]
        piece = max(1, int(eng.bucket_mb * 2**20 / 4))
        self.layout = layout = Layout.build(sizes, n, piece, self.p3)
        self.buf = torch.zeros(layout.size)
        self.params, self.rule, self.net_params = params, rule, net_params
        self.in_place = params.data_ptr() == net_params[0].data_ptr()  # views of θ: no copies
        self.round, self.waited = 0, 0.0  # the round being computed; seconds waited for pieces
        self.applied = [0] * len(layout.pieces)  # the last round each piece was applied for
        index = {id(p): i for i, p in enumerate(net_params)}
        self.left_in = [0] * len(layout.pieces)  # tensors (and the tail) still to come
        for i in range(len(sizes)):
            for k in layout.holding(i):
                self.left_in[k] += 1
        self.left_in[0] += 1
        self.fresh = list(self.left_in)
        if self.p3:
            for module in net.modules():
                own = [index[id(p)] for p in module.parameters(recurse=False)]
                if own:
                    module.register_forward_pre_hook(lambda m, a, own=own: self.apply(own))
        self.pace = Pace(net, net_params)  # after P3's waits, before the gradient hooks
        for i, p in enumerate(net_params):
            p.register_hook(lambda g, i=i: self.made(i, g))
        order = layout.order(network.profile, nominal, self.p3)
        self.link = Link(network, [self.buf[a:b] for a, b in layout.pieces], order)

    def made(self, i: int, grad: torch.Tensor) -> None:
        """Backward has made tensor i's gradient: into the buffer; post what it completes."""
        lo = self.layout.offsets[i]
        self.buf[lo : lo + self.layout.sizes[i]].copy_(grad.reshape(-1))
        for k in self.layout.holding(i):
            self.one_less(k)

    def one_less(self, k: int) -> None:
        self.left_in[k] -= 1
        if self.left_in[k] == 0:
            self.link.post(k, self.round)

    def finish(self, stats: list[float], stop: bool) -> None:
        """Backward is done: the tail (this rank's slots, zeros elsewhere) completes piece 0."""
        tail = self.buf[: self.layout.tail]
        tail.zero_()
        rank_slots = tail[:-1].view(self.n, 3)
        rank_slots[self.rank] = torch.tensor(stats)
        tail[-1] = float(stop)
        self.one_less(0)
        self.left_in = list(self.fresh)

    def stats(self, round_: int) -> tuple[torch.Tensor, bool]:
        """Round `round_`'s tail once it is in: (per-rank stats, stop flag)."""
        start = time.perf_counter()
        self.link.wait(0)
        self.waited += time.perf_counter() - start
        tail = self.buf[: self.layout.tail]
        return tail[:-1].view(self.n, 3).clone(), bool(tail[-1] > 0)

    def apply(self, tensors: list[int]) -> None:
        """P3: the previous round's pieces of these tensors, applied (waited for first)."""
        done = self.round - 1
        if done < 1:
            return
        for i in tensors:
            for k in self.layout.holding(i):
                if self.applied[k] < done:
                    start = time.perf_counter()
                    self.link.wait(k)
                    self.waited += time.perf_counter() - start
                    lo, hi = self.layout.span(k)
                    grad = self.buf[self.layout.tail :]
                    grad[lo:hi].div_(self.n)
                    self.rule.apply_part(self.params, grad, lo, hi)
                    self.applied[k] = done
            if not self.in_place:
                p, lo = self.net_params[i], self.layout.offsets[i] - self.layout.tail
                p.data.copy_(self.params[lo : lo + p.numel()].view_as(p))

    def apply_all(self) -> None:
        """The round's update, all of it: under fifo once its pieces are in, under P3 what the
        forward pass did not reach. Counted once."""
        if self.p3:
            self.apply(list(range(len(self.net_params))))
            self.rule.count()
            return
        start = time.perf_counter()
        for k in range(len(self.layout.pieces)):
            self.link.wait(k)
        self.waited += time.perf_counter() - start
        self.rule.step(self.params, self.buf[self.layout.tail :].div_(self.n), -1, 0)


def measure_step(job: Job, rank: int, net, net_params, network: Shaped) -> float:
    """The step time the P3 order is planned for, the same on every rank: the profile's mean
    step time, or with no modelled compute rank 0's measured step (a warm-up)."""
    if job.profile.cfg.compute_ms > 0:
        return job.profile.cfg.compute_ms / 1000.0
    device, sample = net_params[0].device, (job.splits.x_train[:32], job.splits.y_train[:32])
    gradient(net, net_params, sample, device)
    start = time.perf_counter()
    gradient(net, net_params, sample, device)
    seconds = torch.tensor([time.perf_counter() - start if rank == 0 else 0.0])
    network.inner.all_reduce(seconds)
    return float(seconds[0])


def build_replica(job: Job, device: torch.device):
    """(θ₀'s model, θ, the update rule, the replica's net, its parameter tensors): on the
    CPU the net's parameters are views of θ, so an update needs no copy."""
    model = job.model()
    params = parameters_to_vector(model.parameters()).detach().clone()
    rule = UPDATES.build(job.cfg.algorithm.update, params, job.num_workers)
    rule.set_shapes([p.shape for p in model.parameters()])  # a torch optimizer: DDP's tensors
    net = job.model().to(device)
    if device.type == "cpu":
        flatten_parameters(net, params)
    return model, params, rule, net, list(net.parameters())


def overlapped(job: Job, rank: int, run_dir: Path, transport: Transport) -> dict[str, Any] | None:
    """One replica of engine=allreduce with its rounds in pieces (the one-message round's
    `replica`, with `Rounds` in place of the single all-reduce)."""
    n = job.num_workers
    device = job.device(rank)
    model, params, rule, net, net_params = build_replica(job, device)
    batches, profile, faults = job.batches(rank), job.profile, Faults(job.profile, rank)
    network = Shaped(transport, profile, faults)
    record = RunRecord(job, run_dir) if rank == 0 else None
    rounds = Rounds(job, rank, net, net_params, params, rule, network)
    status, error, stop, version, bytes_sent = "completed", None, False, 0, 0
    network.barrier()
    t0 = time.perf_counter()

    def applied(stats: torch.Tensor, reduce_s: float) -> None:  # rank 0: a round is in θ
        nonlocal status, stop
        t, own = time.perf_counter() - t0, float(stats[0, 0])
        bad, spent_ = close_round(record, t, version, stats, reduce_s, own, params)
        status = "diverged" if bad else status
        stop = stop or bad or spent_

    try:
        while True:
            rounds.round += 1
            now = time.perf_counter() - t0
            paused = faults.strike(now, lambda at, s: time.sleep(s)) - now  # stalls the round
            start, rounds.waited = time.perf_counter(), 0.0
            if rounds.p3 and rounds.round > 1:  # round − 1's tail: its statistics, the stop flag
                stats, halt = rounds.stats(rounds.round - 1)
                if halt:
                    break
            elif not rounds.in_place:
                vector_to_parameters(params.to(device), net_params)
            rounds.pace.start(profile.step_s(rank))
            x, y = next(batches)
            loss = objective(net(x.to(device)), y.to(device))  # P3: applies round − 1 by layer
            if rounds.p3 and rounds.round > 1:
                rounds.apply_all()
                version += 1
                bytes_sent += ring_volume(rounds.buf.numel() * 4, n)
                if record is not None:
                    applied(stats, rounds.waited)
            rounds.pace.backward()
            torch.autograd.grad(loss, net_params)  # the hooks post the pieces as they are made
            compute = time.perf_counter() - start - rounds.waited
            rounds.finish([compute, loss.item(), paused], stop)
            if not rounds.p3:
                rounds.waited = 0.0
                stats, halt = rounds.stats(rounds.round)
                if halt:
                    break
                rounds.apply_all()
                version += 1
                bytes_sent += ring_volume(rounds.buf.numel() * 4, n)
                if record is not None:
                    applied(stats, rounds.waited)
        rounds.link.close()  # inside: a peer lost at the last piece fails the run, by name
    except WorkerDied:
        raise  # its process exits; the others lose it in the next all-reduce
    except Exception as exc:  # what is still under way is abandoned: waiting would raise again
        status, error = "failed", str(exc)
        if record is None:
            raise
    if record is None:
        return None
    return record.finish(
        model, params, version, time.perf_counter() - t0, status, error, bytes_sent=bytes_sent
    )
