"""engine=gossip's role, a node's rank, written once for both runtimes
(`stalebench.runtime.world`); the node itself (x, w, z) and its iteration: `node`.

The protocol, an iteration k at a time (its gradient and local step: `node`): each node
sends its share of (x, w) to each out-peer of iteration k without waiting (isend; a send's
buffer is kept until delivered, which the receiver allows within τ + 1 iterations) and
waits only for the messages its in-peers sent at k − τ. Every engine.sync_every iterations
the nodes meet (the harness's collective, free on the wire and in no byte count): one
all-reduce of z (z̄, which rank 0 snapshots), one of the statistics (rank 0 writes the
window's events), in which rank 0's order (stop, or save: every rank then saves its part
of a checkpoint) and each node's divergence travel, so every rank stops after the same
iteration.

A lost node ends the run (its out-peers' receives and the next meeting fail) unless
cluster.min_replicas is set: then a node whose exchange with a peer fails (dead, or silent
past timeout_s) counts that peer lost and keeps at home the share it would send it — the
lost edge's weight moved to the diagonal: D-PSGD's W stays symmetric and doubly stochastic
over the nodes left, PushSum keeps its mass (a node that only sends to a lost peer loses
those shares until the next meeting, where every node learns who is lost). A spare (a rank
after the N nodes) stands by until a meeting chooses it for a lost node's place; it starts
from z̄ (w = 1) with the lowest survivor's local optimizer.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import torch

from stalebench import placement
from stalebench.engines.common import catch_up
from stalebench.engines.gossip.node import (
    ROW,
    Net,
    Node,
    gossip_bytes,
    mixing,
    report,
    stats_slots,
    syncs_at,
)
from stalebench.errors import RunError
from stalebench.job import Job
from stalebench.runtime.driver import Ending, Role
from stalebench.runtime.members import Members
from stalebench.runtime.record import diverged, gradient, spent
from stalebench.runtime.world import Op, World

STOP, SAVE = 1.0, 2.0  # rank 0's order in the meeting's statistics


class Peer(Role):
    """One node's rank: its node, its sends in flight, its statistics since the last meeting."""

    def __init__(self, job: Job, world: World, index: int | None = None):
        self.job, self.world, self.rank = job, world, world.rank
        # the node it plays (a spare: a lost one; a checkpoint's "me")
        self.index = world.rank if index is None else index
        self.n, self.rule = job.num_workers, world.shared("mixing", lambda: mixing(job))
        self.net = world.shared("net", lambda: Net(job, world.device))
        # false: a cost-only run (sim.numerics=false), whose x, w and messages have no values
        self.values = job.numerics
        theta = self.net.flat.detach().clone()  # θ₀, the same in every rank, on its device
        self.node = Node(job, self.index, theta, self.net, self.rule)
        self.sync_every, self.num_params = job.cfg.engine.sync_every, theta.numel()
        # z̄ in host memory (pinned on a GPU): the meetings all-reduce it over gloo
        self.z_mean = placement.on_host(theta.clone())
        self.first, self.nbytes, self.status = 0, 0, "completed"
        self.in_flight: deque[tuple[int, torch.Tensor, list[tuple[Any, int]]]] = deque()
        self.rows: list[list[float]] = []
        # a message [x | w], taken in at once, in host memory (pinned on a GPU) for gloo
        self.inbox = placement.on_host(theta.new_empty(self.num_params + 1))
        self.carried = [0.0, 0.0]  # wait, comm of the last collective, for the next row
        self.save, self.met_at = False, 0.0  # a checkpoint after the last meeting; its time
        self.lost: set[int] = set()  # nodes known lost
        # each rank's node (-1: a spare standing by, or a lost rank), the nodes at the last
        # meeting (`live`), and each node's rank
        self.members = Members(job, world)
        self.ranks = list(range(self.n))  # from `members.workers` (`placed`)
        self.stands_by = self.rank >= self.n  # a spare (cluster.spares)
        # the peer whose iterations this rank runs (one of another node, built once this
        # rank plays it), from which iteration
        self.playing: Peer | None = None
        self.first_iteration = 0

    def warm_up(self) -> Any:
        x, y = self.job.splits.x_train[:1], self.job.splits.y_train[:1]
        return gradient(self.net.forward, self.net.params, (x, y), self.net.device)

    def start(self) -> None:
        self.world.play(self.index)
        self.playing = self

    def evaluated(self) -> torch.Tensor:
        return self.z_mean  # z̄: θ₀ at the start

    def load(self, part: dict[str, Any]) -> None:
        """A resumed run: as the node this rank's part of the checkpoint says."""
        same = part["me"] == self.index
        self.playing = self if same else Peer(self.job, self.world, part["me"])
        self.first_iteration = self.playing.restore(part)

    def take_over(self, state: dict[str, Any]) -> bool:
        """A spare (or a resumed run's rank that took no part) in a lost node's place,
        unless the meeting that chose it ended the run."""
        if state["stop"]:
            return False
        self.playing = Peer(self.job, self.world, state["workers"][self.rank])
        self.first_iteration = self.playing.join(state)
        return True

    def run(self) -> Op[Ending | None]:
        return (yield from self.playing.loop(self.first_iteration))

    def fail(self, exc: Exception) -> Op[Ending | None]:
        """The nodes lost before the failing meeting are logged."""
        peer = self.playing
        if peer is None:
            raise exc
        peer.t_end = self.world.now()
        peer.members.failed(exc, peer.iteration, peer.t_end)
        return peer.ending()
        yield  # unreachable: an op

    def loop(self, k: int) -> Op[Ending | None]:
        """Iterations from k (and the meetings) until the run stops; rank 0's ending."""
        self.iteration = k  # the one under way (after the last: the number taken)
        while True:
            yield from self.iterate(k)
            k = self.iteration = k + 1
            if syncs_at(k - 1, self.sync_every, self.job.cfg.budget.max_updates):
                if (yield from self.meet(k)):
                    break
                if self.save:  # rank 0's order at the meeting: every rank, at once
                    yield from self.checkpoint(k)
        self.t_end = self.world.now()
        yield from self.drain(k)
        return self.ending()

    def ending(self) -> Ending:
        net = self.net
        for kept, mine in zip(net.buffers, self.node.buffers, strict=True):
            kept.copy_(mine)  # its BatchNorm statistics (rank 0's, for the evaluation)
        return Ending(net.model, self.z_mean, self.first, self.t_end, self.status,
                      bytes_sent=self.nbytes)  # fmt: skip

    # what a rank's checkpoint holds besides its node: the node it plays ("me"), z̄, the
    # iterations met, bytes so far, the nodes lost (and who plays which node, who met)
    KEPT = ("z_mean", "first", "nbytes", "carried", "lost")

    def checkpoint(self, k: int) -> Op[None]:
        """After the meeting that follows iteration k − 1 (τ = 0: every message sent so far
        is taken in): this rank's part of a checkpoint set (`World.checkpoint`)."""
        yield from self.settle(k)  # delivered already: the sends' handles let go
        node = self.node
        part = {"me": self.index, **{key: getattr(self, key) for key in self.KEPT}}
        part.update(k=k, x=node.x, w=node.w, inner=node.inner, buffers=node.buffers,
                    workers=self.members.workers, met=self.members.live)  # fmt: skip
        yield from self.world.checkpoint(k, part, self.met_at)

    def restore(self, part: dict[str, Any]) -> int:
        """A resumed run's rank: its part of the checkpoint set, its minibatches and step
        times from the iterations it took (the node it plays is the part's: `run`); returns
        the next iteration."""
        for key in self.KEPT:
            setattr(self, key, part[key])
        self.members = Members(self.job, self.world, part["workers"], part["met"])
        self.placed()
        node = self.node
        node.x, node.w, node.inner, node.buffers = (
            part["x"], part["w"], part["inner"], part["buffers"],
        )  # fmt: skip
        catch_up(self.job.profile, self.index, node.batches, part["k"])
        return part["k"]

    def join(self, state: dict[str, Any]) -> int:
        """A spare chosen to play a lost node: its x is z̄ (w = 1) and its local optimizer
        the lowest survivor's; its minibatches, step times and later faults from the
        iterations the node took; returns the next iteration."""
        node, k = self.node, state["k"]
        node.x, node.inner = state["x"], state["inner"]  # the optimizer steps this very x
        node.x.copy_(state["z_mean"])
        node.w.fill_(1.0)
        for key in ("z_mean", "first", "lost"):
            setattr(self, key, state[key])
        self.members = Members(self.job, self.world, state["workers"], state["met"])
        self.placed()
        self.world.play(self.index, self.world.now(), k, replaced=True)
        catch_up(self.job.profile, self.index, node.batches, k)
        return k

    def welcome(self, k: int, stop: bool) -> Op[None]:
        """The nodes left, after the meeting that chose spares: each spare takes a lost
        node's place (rank 0 logs `replaced`) and gets z̄ and the lowest survivor's local
        optimizer."""
        live = self.members.take_in_spares()
        self.placed()
        self.lost -= set(live)
        state = {"x": self.node.x, "inner": self.node.inner, "z_mean": self.z_mean, "k": k,
                 "first": self.first, "workers": self.members.workers, "lost": self.lost,
                 "met": live, "stop": stop}  # fmt: skip
        yield from self.world.welcome(state)

    def placed(self) -> None:
        """Each node's rank, from each rank's node (`members.workers`)."""
        self.ranks = [self.members.workers.index(i) for i in range(self.n)]

    def iterate(self, k: int) -> Op[None]:
        """Iteration k: the gradient at z, the local step and the gossip, in the rule's order."""
        node, rule, world = self.node, self.rule, self.world
        paused = world.strike()
        step = node.gradient(self.net)
        (grad, loss), compute = yield from world.compute(step, self.job.profile.step_s(self.index))
        if not rule.mixes_first and self.values:
            node.step(grad)
        message, sends = placement.on_host(node.send(k)) if self.values else self.inbox, []
        wire_s = world.wire_s  # the network's seconds so far
        for peer in rule.out_peers(self.index, k):
            try:
                if peer not in self.lost:
                    sends.append(((yield from world.isend(message, self.ranks[peer])), peer))
                    continue
            except RunError:  # real processes: the peer's connection closed
                if not self.members.quorum:
                    raise
                self.lost.add(peer)
            if self.values:
                node.receive(message)  # a lost peer's share stays home
        self.in_flight.append((k, message, sends))
        yield from self.settle(k - rule.delay)
        wait, comm = self.carried
        took = k >= rule.delay
        if took:  # the messages the in-peers sent at k − τ
            for peer in rule.in_peers(self.index, k - rule.delay):
                if peer in self.lost:
                    continue
                try:
                    wait += yield from world.recv(self.inbox, self.ranks[peer])
                except RunError:
                    if not self.members.quorum:
                        raise
                    self.lose(peer, message if any(p == peer for _, p in sends) else None)
                    continue
                if self.values:
                    node.receive(self.inbox)
        comm += world.wire_s - wire_s  # its sends' and receives' time on the wire
        if rule.mixes_first and self.values:
            node.step(grad)
        self.rows.append([world.now(), loss, compute, wait, comm, paused, rule.delay * took])
        self.carried = [0.0, 0.0]

    def lose(self, peer: int, sent: torch.Tensor | None) -> None:
        """cluster.min_replicas: `peer` is lost; `sent`, the message this iteration sent
        it, if any, which it never took in: its share comes back."""
        self.lost.add(peer)
        if sent is not None and self.values:
            self.node.receive(sent)

    def settle(self, upto: int) -> Op[None]:
        """Wait for the sends of iterations before `upto` (their receivers take them in by
        now) and let their buffers go."""
        while self.in_flight and self.in_flight[0][0] < upto:
            _, _, sends = self.in_flight.popleft()
            for work, peer in sends:
                try:
                    yield from self.world.wait(work, self.ranks[peer])
                except RunError:
                    if not self.members.quorum:
                        raise
                    self.lost.add(peer)  # a send to a lost peer: nobody took it in

    def drain(self, k: int) -> Op[None]:
        """After the last iteration k − 1: the messages still in flight (τ > 0) are received
        and dropped, so that every send completes."""
        for sent_at in range(max(k - self.rule.delay, 0), k):
            for peer in self.rule.in_peers(self.index, sent_at):
                if peer not in self.lost:
                    yield from self.world.recv(torch.empty_like(self.inbox), self.ranks[peer])
        yield from self.settle(k)

    def meet(self, version: int) -> Op[bool]:
        """The collective after iteration `version` − 1 (every rank calls it there): z̄, the
        statistics; rank 0 writes the events and the snapshot. True when the run stops."""
        n, world, record = self.n, self.world, self.world.record
        t_enter, z = world.now(), self.node.z
        live = yield from self.all_reduce(self.z_mean.copy_(z))
        self.z_mean /= len(live)
        stats = torch.zeros(stats_slots(n, self.sync_every), dtype=torch.float64)
        width = self.sync_every * len(ROW)  # a node's rows in the window
        mine = torch.tensor(self.rows, dtype=torch.float64).flatten()
        stats[self.index * width : self.index * width + mine.numel()] = mine
        if self.values:  # a cost-only run has no distance, loss or θ to check
            stats[n * width + self.index] = float((z - self.z_mean.to(z.device)).norm())
            losses = [row[1] for row in self.rows]
            stats[-1] = float(any(not math.isfinite(v) for v in losses) or diverged(0.0, z))
        if record is not None:  # rank 0's order: stop, or a checkpoint after this meeting
            stop = spent(self.job.cfg.budget, version, t_enter)
            save = self.rule.delay == 0 and world.checkpoint_due(t_enter)
            stats[-2] = self.members.offer(STOP if stop else SAVE if save else 0.0)
        live = yield from self.all_reduce(stats)
        order = self.members.heard(float(stats[-2]))  # the ranks invited join after it
        self.members.left(version, live)  # every node learns who is lost; rank 0 logs them
        self.lost = set(range(n)) - set(live)
        self.save, self.met_at = bool(order == SAVE and stats[-1] == 0), t_enter
        self.carried = [world.now() - t_enter, 0.0]  # waited for the others; the wire: free
        if record is not None:  # rank 0 counts every rank's bytes (the gossip's only)
            iterations = len(self.rows)  # since the last meeting
            self.nbytes += gossip_bytes(self.rule, self.first, version, self.num_params, self.lost)
            rows = stats[: n * width].view(n, self.sync_every, len(ROW))[live, :iterations]
            rows = rows.numpy()
            dists = stats[n * width : -2].numpy()[live]
            report(record.events.emit, self.first, rows, dists, live)
            record.snapshots.maybe(world.now(), version, self.z_mean)
            if stats[-1] > 0:
                self.status = "diverged"
        self.first, self.rows = version, []
        stop = bool(order == STOP or stats[-1] > 0)
        if world.joining:  # spares take the lost nodes' places from the next iteration
            self.save = False  # they would take no part: it stays due
            yield from self.welcome(version, stop)
        return stop

    def all_reduce(self, buf: torch.Tensor) -> Op[list[int]]:
        """A meeting's all-reduce: over every node, or (cluster.min_replicas) over the nodes
        left; the nodes summed. The harness's measurement, not the algorithm's traffic: it
        costs no time on the wire (`seconds=0.0`), only the wait for the slowest node."""
        return sorted((yield from self.members.summing(buf, 0.0)))
