"""The algorithm contract: a barrier decides *when* a worker may start its next step; an
update rule decides *how* an arriving (possibly stale) gradient changes the parameters and
*what* parameters a worker gets back. Both are pure: clocks and tensors in, decisions and
tensors out; they know nothing of processes, sockets or time sources.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from stalebench.errors import ConfigError
from stalebench.registry import ComponentConfig, Part, Registry

if TYPE_CHECKING:  # torch is imported lazily: the CLI validates configs without it
    import torch


@dataclasses.dataclass
class BarrierConfig(ComponentConfig):
    # per_arrival: apply each gradient as it arrives; per_round: average the gradients of one
    # clock from every worker and apply them once (BSP, docs/algorithms.md §2.1, §4.5)
    apply: str = "per_arrival"
    # a lost worker, under a barrier that waits for it: fail the run, or reform the barrier
    # over the survivors (bsp, ssp). A barrier that never waits (asp) always goes on.
    on_loss: str = "fail"

    def __post_init__(self) -> None:
        if self.apply not in ("per_arrival", "per_round"):
            raise ConfigError(
                f"algorithm.barrier.apply must be 'per_arrival' or 'per_round', got {self.apply!r}"
            )
        if self.on_loss not in ("fail", "reform"):
            raise ConfigError(
                f"algorithm.barrier.on_loss must be 'fail' or 'reform', got {self.on_loss!r}"
            )


@dataclasses.dataclass
class UpdateConfig(ComponentConfig):
    lr: float = 0.1  # learning rate η
    weight_decay: float = 0.0  # L2 coefficient, added to the gradient at the server's θ
    # linear warm-up of the learning rate from η/N to η over this many server updates, η
    # reached at the last of them (the DANA/GA simulators' schedule, docs/algorithms.md
    # §3.1); 0 = constant η
    warmup_updates: int = 0

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ConfigError(f"algorithm.update.lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ConfigError(
                f"algorithm.update.weight_decay must be >= 0, got {self.weight_decay}"
            )
        if self.warmup_updates < 0:
            raise ConfigError(
                f"algorithm.update.warmup_updates must be >= 0, got {self.warmup_updates}"
            )


def _no_emit(kind: str, t: float, **fields: Any) -> None:
    pass


class Barrier(Part):
    """When may a worker start its next step. `clocks[i]` = steps worker i has completed."""

    # True when every worker waits for the whole round and the round is one update (BSP):
    # only such a barrier can run on the allreduce engine, where the all-reduce is the barrier
    synchronous: ClassVar[bool] = False
    # True when no worker ever waits for another: a lost worker leaves the others as they
    # were, so the run goes on with the survivors (otherwise a lost worker fails the run)
    tolerates_loss: ClassVar[bool] = False
    # True when admission reads only the slowest clock (and rounds are per clock): without a
    # lost worker's clock the barrier is the same rule over the survivors (on_loss=reform)
    reformable: ClassVar[bool] = False
    # True when the server gathers arriving gradients into one update of several (a round,
    # a global batch): each is weighed by its lag (`weigh`, 0 drops it), the update is
    # applied once `quorum` are kept, and admission asks `admit_gathered`
    gathers: ClassVar[bool] = False

    def __init__(self, cfg: BarrierConfig, num_workers: int, seed: int = 0):
        self.cfg = cfg
        self.num_workers = num_workers
        self.per_round = cfg.apply == "per_round"
        # emit(kind, t, **fields): the engine points this at the run's event log, so a
        # barrier can record its decisions (kind "barrier", with `worker` and `event`)
        self.emit: Callable[..., None] = _no_emit

    @classmethod
    def survives_loss(cls, cfg: BarrierConfig) -> bool:
        """Does a run with this barrier and `cfg` go on when a worker is lost?"""
        return cls.tolerates_loss or cfg.on_loss == "reform"

    @classmethod
    def needs(cls, cfg: BarrierConfig) -> dict[str, str]:
        """on_loss=reform: an engine that re-forms the barrier over the survivors."""
        return {"reform": "on_loss=reform"} if cfg.on_loss == "reform" else {}

    @classmethod
    def check(cls, cfg: BarrierConfig, num_workers: int, run: Any = None) -> None:
        if cfg.on_loss == "reform" and not cls.reformable:
            able = BARRIERS.names_with("reformable")
            raise ConfigError(
                f"algorithm.barrier.on_loss=reform: barrier {cfg.name} decides from more "
                f"than the slowest clock and cannot be re-formed over the survivors; "
                f"{', '.join(able)} can"
            )

    def observe_push(self, worker: int, clocks: Sequence[int], now: float) -> None:
        """Called after a push from `worker` has been counted (clocks already advanced)."""

    def admit(self, worker: int, clocks: Sequence[int], slowest: int) -> bool:
        """May `worker` start step `clocks[worker]` now? Asked right after its push and
        again after every later push while it waits. `slowest` = min(clocks), kept by the
        server in O(1): use it rather than scanning `clocks` (asked once per held worker
        per push, a scan would cost O(N²) per round at N workers)."""
        raise NotImplementedError

    def weigh(self, lag: int) -> float:
        """A gathering barrier: the weight of a gradient `lag` updates stale (0 drops it)."""
        return 1.0

    def quorum(self, lost_outside: int) -> int:
        """A gathering barrier: how many kept gradients make the update, when
        `lost_outside` lost workers have none among those gathered so far."""
        return self.num_workers - lost_outside

    def admit_gathered(self, gathered: bool, open_: int, computing: int) -> bool:
        """A gathering barrier: may a worker start its next step now? `gathered`: one of
        its gradients waits in the open update; `open_` gradients wait there in all;
        `computing` workers are computing one."""
        return not gathered

    def rebalance(
        self, version: int, samples: list[int], seconds: list[float], sizes: list[int]
    ) -> list[int] | None:
        """A gathering barrier, after update `version`: new minibatch sizes per worker, or
        None to keep `sizes`; `samples` and `seconds` are each worker's computed samples and
        compute time since the sizes last changed."""
        return None


class UpdateRule(Part):
    """How a gradient with its lag changes θ (in place), and which parameters a worker reads.

    The engine calls `step` for every gradient (or a round's mean gradient, with worker −1);
    rules implement `apply` and read the scheduled learning rate from `self.lr`."""

    # True when the rule keeps per-worker state (momentum, read parameters): it cannot take
    # a round's averaged gradient (`apply=per_round`), which belongs to no single worker.
    per_worker: ClassVar[bool] = False
    # True when a step on θ[a:b] reads and writes only [a:b] of θ, of the gradient and of
    # the tensors `part_state` names: a round's update can then be applied piece by piece
    # (`apply_part`; engine=allreduce's P3 schedule applies each slice as it arrives)
    elementwise: ClassVar[bool] = False

    def __init__(self, cfg: UpdateConfig, params: torch.Tensor, num_workers: int):
        self.cfg = cfg
        self.num_workers = num_workers
        self.updates = 0  # gradients applied so far

    @classmethod
    def check(cls, cfg: UpdateConfig, num_workers: int, run: Any = None) -> None:
        """A rule with per-worker state takes no round's mean (the run's barrier's `apply`)."""
        barrier = run.algorithm.barrier if run is not None else None
        if cls.per_worker and barrier is not None and barrier.apply == "per_round":
            raise ConfigError(
                f"algorithm.update={cfg.name} keeps per-worker state and cannot take a "
                "round's averaged gradient (algorithm.barrier.apply=per_round); use a barrier "
                "that applies per arrival"
            )

    @property
    def lr(self) -> float:
        """η of the next update (`rate`)."""
        return self.rate(self.updates)

    def rate(self, update: int) -> float:
        """η of update `update` (0-based): over the first W = `warmup_updates` updates the
        DANA and SMEGA2 simulators' warm-up, np.linspace(η/N, η, W)[update] (η/N at update 0,
        η at update W − 1, computed as numpy does, to the last bit), then η."""
        warm, lr = self.cfg.warmup_updates, self.cfg.lr
        if update >= warm:
            return lr
        start = lr / self.num_workers
        if update == warm - 1:  # linspace's last point: η exactly, or its start when W = 1
            return lr if warm > 1 else start
        return update * ((lr - start) / (warm - 1)) + start

    def set_shapes(self, shapes: Sequence[Sequence[int]]) -> None:
        """θ is the model's parameter tensors of these shapes, flattened in order. The
        engines call it once the rule is built, before its first step: a rule that steps
        tensor by tensor (a torch optimizer, as in DDP's replicas) views θ that way; one
        that treats θ as a whole ignores it (the default)."""

    def step(self, params: torch.Tensor, grad: torch.Tensor, worker: int, lag: int) -> None:
        self.apply(params, grad, worker, lag)
        self.updates += 1

    def apply(self, params: torch.Tensor, grad: torch.Tensor, worker: int, lag: int) -> None:
        raise NotImplementedError

    def part_state(self) -> dict[str, torch.Tensor]:
        """An element-wise rule's state with θ's shape, by attribute name."""
        return {}

    def apply_part(self, params: torch.Tensor, grad: torch.Tensor, lo: int, hi: int) -> None:
        """Apply a round's mean gradient (worker −1, lag 0) to θ[lo:hi] alone, at the
        round's learning rate; it is not counted: once every part of the round is applied,
        `count()`. Element for element the same as `step` on the whole (an element-wise
        rule: `elementwise`)."""
        if not self.elementwise:
            raise TypeError(f"{type(self).__name__} is not element-wise")
        state = self.part_state()
        try:
            for name, tensor in state.items():
                setattr(self, name, tensor[lo:hi])
            self.apply(params[lo:hi], grad[lo:hi], -1, 0)
        finally:
            for name, tensor in state.items():
                setattr(self, name, tensor)

    def count(self) -> None:
        """One more update applied (by its parts)."""
        self.updates += 1

    def params_for(self, params: torch.Tensor, worker: int) -> torch.Tensor:
        """The parameters sent to `worker` for its next gradient (default: θ itself). Called
        when the worker is admitted; the result is sent before θ changes again."""
        return params

    @classmethod
    def worker_message(cls, cfg: UpdateConfig, grad: torch.Tensor, state: dict) -> torch.Tensor:
        """Runs on the worker: what it sends for gradient `grad` (default: the gradient).
        `state` is the worker's own dict, kept across its steps (e.g. DANA-Slim's momentum)."""
        return grad


BARRIERS: Registry[Barrier] = Registry(
    "barrier", "algorithm/barrier", "algorithm.barrier", BarrierConfig
)
UPDATES: Registry[UpdateRule] = Registry(
    "update rule", "algorithm/update", "algorithm.update", UpdateConfig
)
