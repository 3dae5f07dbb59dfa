"""The parameter-server engine as a pure state machine.

A runtime feeds it "worker i pushed the gradient of its step c, computed on version v" and
gets back the replies to send now (parameters for the workers the barrier admits). It knows
no algorithm by name: the barrier decides admission and whether a round's gradients are
averaged; the update rule applies gradients and chooses what each worker reads.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stalebench.errors import RunError
from stalebench.registry import stored

if TYPE_CHECKING:
    import torch

    from stalebench.algorithms.base import Barrier, UpdateRule


@stored
@dataclasses.dataclass
class Push:
    worker: int  # 0-based worker index (rank − 1 in the real runtime)
    clock: int  # the step this gradient belongs to (= steps the worker completed before)
    version_read: int  # server version of the parameters it was computed on
    grad: torch.Tensor
    loss: float  # the minibatch's training loss
    compute_s: float  # the step's compute time (real + emulated)
    rtt_s: float  # worker-side time from its previous push to receiving these parameters


@dataclasses.dataclass
class Reply:
    worker: int
    params: torch.Tensor  # valid until the next call into the server: send or copy it first
    version: int
    batch: int = 0  # the minibatch size of the step it starts (0: dataset.batch_size)


class ParameterServer:
    def __init__(
        self,
        params: torch.Tensor,
        barrier: Barrier,
        rule: UpdateRule,
        num_workers: int,
        emit: Callable[..., Any],
        batch_size: int = 0,
        values: bool = True,
    ):
        self.params = params  # flat θ, updated in place
        # false: a cost-only run's (sim.numerics=false): the rule's arithmetic is skipped
        self.values = values
        self.barrier, self.rule, self.num_workers = barrier, rule, num_workers
        self.emit = emit  # emit(kind, t, **fields)
        barrier.emit = emit
        self.version = 0
        self.clocks = [0] * num_workers  # steps completed per worker
        # the slowest clock, kept in O(1) per push (clocks only grow by one): at a thousand
        # simulated workers a min() over all clocks per admission would dominate an event
        self.min_clock = 0
        self._at_clock = collections.Counter({0: num_workers})
        self.held: dict[int, float] = {}  # worker -> time its push arrived (waiting to start)
        self.lost: set[int] = set()  # workers gone for good
        self.wait_s = [0.0] * num_workers  # barrier wait before the step in progress
        self.gap = [0] * num_workers  # clock gap when the step in progress was admitted
        self.rounds: dict[int, dict[int, tuple[Push, dict[str, Any]]]] = {}
        # a gathering barrier's open update: (push, its event fields, its weight)
        self.gathered: list[tuple[Push, dict[str, Any], float]] = []
        # each worker's minibatch size (a barrier may re-assign them: `rebalance`), the size
        # of the step it is computing, and its samples and compute time since the last change
        self.batch_size = batch_size
        self.sizes = [batch_size] * num_workers
        self.reading = [batch_size] * num_workers
        self.samples, self.busy_s = [0] * num_workers, [0.0] * num_workers

    def start(self, now: float) -> list[Reply]:
        """Step 0, or the first step after a resume: every worker still in the run is held,
        and reads θ once the barrier admits it."""
        self.held = {w: now for w in range(self.num_workers) if w not in self.lost}
        return self._release(now)

    def state(self) -> dict[str, Any]:
        """Everything a resumed server needs, for one `torch.save`: θ, the version and the
        clocks, the rounds in progress, and the barrier and the update rule whole (their
        buffers and random streams). Workers held or computing now are held again by the
        resumed `start`."""
        barrier = copy.copy(self.barrier)
        barrier.emit = None  # the event log stays with this process
        kept = {k: v for k, v in vars(self).items() if k not in ("emit", "held")}
        return {**kept, "barrier": barrier}  # the copy, not the live barrier

    def resume(self, state: dict[str, Any]) -> None:
        """Take over the `state()` of an earlier server of this run."""
        for key, value in state.items():
            setattr(self, key, value)
        self.barrier.emit = self.emit
        self.held = {}

    def on_push(self, push: Push, now: float) -> list[Reply]:
        w = push.worker
        if push.clock != self.clocks[w]:
            raise RunError(f"worker {w} pushed clock {push.clock}, expected {self.clocks[w]}")
        record = {
            "worker": w,
            "clock": push.clock,
            "loss": push.loss,
            "compute_s": push.compute_s,
            "wait_s": self.wait_s[w],
            "comm_s": max(0.0, push.rtt_s - self.wait_s[w]),
            "clock_gap": self.gap[w],
        }
        self.clocks[w] += 1
        self._at_clock[push.clock] -= 1
        self._at_clock[push.clock + 1] += 1
        if push.clock == self.min_clock and not self._at_clock[push.clock]:
            del self._at_clock[push.clock]
            self.min_clock += 1  # the pusher now sits at min + 1, so nobody is lower
        if self.barrier.gathers:
            self._gather(push, record, now)
        elif self.barrier.per_round:
            self._apply_rounds(push, record, now)
        else:
            self._apply([push], [record], now)
        self.barrier.observe_push(w, self.clocks, now)
        self.held[w] = now
        return self._release(now)

    def _apply_rounds(self, push: Push, record: dict[str, Any], now: float) -> None:
        # Rounds complete in clock order: all workers pushing clock c+1 have pushed c. A push
        # is kept past the reply to its worker: its own copy (a runtime may reuse its buffer)
        push = dataclasses.replace(push, grad=push.grad.clone())
        self.rounds.setdefault(push.clock, {})[push.worker] = (push, record)
        self._complete_rounds(now)

    def _complete_rounds(self, now: float) -> None:
        """Apply the rounds every worker still in the run has pushed, in clock order."""
        for clock in sorted(self.rounds):
            entries = self.rounds[clock]
            if len(entries) + sum(w not in entries for w in self.lost) < self.num_workers:
                return
            del self.rounds[clock]
            ordered = [entries[w] for w in range(self.num_workers) if w in entries]  # fixed order
            self._apply([p for p, _ in ordered], [r for _, r in ordered], now)

    def _gather(self, push: Push, record: dict[str, Any], now: float) -> None:
        """A gathering barrier: weigh the gradient by its lag (drop it at weight 0), and
        apply the update once the quorum is kept."""
        lag = self.version - push.version_read
        weight = self.barrier.weigh(lag)
        w = push.worker
        self.samples[w] += self.reading[w]
        self.busy_s[w] += push.compute_s
        if weight and self.reading[w] != self.batch_size:  # its share of the global batch
            weight *= self.reading[w] / self.batch_size
        if weight == 0:
            self.emit("barrier", now, event="dropped", lag=lag, version=self.version, **record)
            return
        push = dataclasses.replace(push, grad=push.grad.clone())  # kept past its reply
        self.gathered.append((push, record, weight))
        self._close_gathered(now)

    def _close_gathered(self, now: float) -> None:
        inside = {p.worker for p, _, _ in self.gathered}
        if len(self.gathered) < self.barrier.quorum(len(self.lost - inside)):
            return
        ordered = sorted(self.gathered, key=lambda g: (g[0].worker, g[0].clock))  # fixed order
        self.gathered = []
        self._apply([p for p, _, _ in ordered], [r for _, r, _ in ordered], now,
                    [w for _, _, w in ordered])  # fmt: skip
        sizes = self.barrier.rebalance(self.version, self.samples, self.busy_s, self.sizes)
        if sizes is not None:
            rates = [n / s for n, s in zip(self.samples, self.busy_s, strict=True)]
            self.emit("barrier", now, worker=-1, event="rebalance", version=self.version,
                      batch_sizes=sizes, samples_per_s=rates)  # fmt: skip
            self.sizes = sizes
            self.samples, self.busy_s = [0] * self.num_workers, [0.0] * self.num_workers

    def _apply(
        self,
        pushes: list[Push],
        records: list[dict[str, Any]],
        now: float,
        weights: list[float] | None = None,
    ) -> None:
        weights = weights or [1.0] * len(pushes)
        if not self.values:  # cost-only: the update's place in the protocol, no arithmetic
            grad, worker = None, -1
        elif len(pushes) == 1 and weights[0] == 1.0:
            grad, worker = pushes[0].grad, pushes[0].worker
        else:  # the (weighted) mean gradient, attributed to no single worker (-1)
            grad, worker = pushes[0].grad.clone(), -1
            if weights[0] != 1.0:
                grad.mul_(weights[0])
            for p, w in zip(pushes[1:], weights[1:], strict=True):
                grad.add_(p.grad, alpha=w)
            grad.div_(len(pushes))
        lag = max(self.version - p.version_read for p in pushes)
        if grad is not None:
            self.rule.step(self.params, grad, worker, lag)
        self.version += 1
        for p, record in zip(pushes, records, strict=True):
            self.emit(
                "update", now, version=self.version, lag=self.version - 1 - p.version_read, **record
            )

    def lose(self, worker: int, now: float) -> list[Reply]:
        """The worker is gone for good: it no longer waits, and the run goes on without it
        (a barrier that never waits for a peer; or one re-formed over the survivors: the
        slowest clock and the rounds become theirs). Returns the replies that releases."""
        self.held.pop(worker, None)
        self.lost.add(worker)
        if self.barrier.tolerates_loss:
            return []
        self._at_clock[self.clocks[worker]] -= 1
        alive = [c for c, k in self._at_clock.items() if k > 0]
        self.min_clock = min(alive, default=self.min_clock)
        if self.barrier.gathers:
            self._close_gathered(now)
        elif self.barrier.per_round:
            self._complete_rounds(now)
        return self._release(now)

    def rejoin(self, worker: int, now: float) -> list[Reply]:
        """A lost worker's place is taken again (by a spare): it goes on from its clock and
        reads θ as the barrier admits it. Only under a barrier that never waits: one
        re-formed over the survivors would have to take back a clock it left behind."""
        if not self.barrier.tolerates_loss or worker not in self.lost:
            raise RunError(f"worker {worker} cannot rejoin (lost: {sorted(self.lost)})")
        self.lost.discard(worker)
        self.held[worker] = now
        return self._release(now)

    def _release(self, now: float) -> list[Reply]:
        replies, admit = [], self.barrier.admit
        if self.barrier.gathers:
            inside = [p.worker for p, _, _ in self.gathered]
            computing = self.num_workers - len(self.lost) - len(self.held)
            # a worker admitted now is computing for the next one asked
            admit = lambda w, *_: self.barrier.admit_gathered(  # noqa: E731
                w in inside, len(inside), computing + len(replies)
            )
        for w in list(self.held):
            if admit(w, self.clocks, self.min_clock):
                self.wait_s[w] = now - self.held.pop(w)
                self.gap[w] = self.clocks[w] - self.min_clock
                self.reading[w] = self.sizes[w]
                params = self.rule.params_for(self.params, w)
                replies.append(Reply(w, params, self.version, self.sizes[w]))
        if self.held and len(self.held) + len(self.lost) == self.num_workers:
            raise RunError(f"deadlock: the barrier holds every worker (clocks {self.clocks})")
        return replies
