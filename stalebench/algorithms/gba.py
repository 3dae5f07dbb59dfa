"""GBA — Global Batch gradients Aggregation (Su et al., NeurIPS 2022), a barrier of the
parameter-server family.

Workers run asynchronously; the server gathers their gradients until the global batch of
synchronous training is reached (`global_batch` gradients of the local batch size; 0 = one
per worker, BSP's round) and applies their mean. The token rule weighs each gradient by its
staleness τ (updates applied since the parameters it was computed on were read): full
weight up to `threshold`, λ^(τ − threshold) beyond it, and λ = 0 drops it (a dropped
gradient fills no place in the global batch). Learning rate and batch size are BSP's, so
`algorithm=gba` ↔ `algorithm=bsp` needs no other change.

`ahead` bounds the gradients under way: a worker starts a step only while those gathered
plus those being computed are fewer than global_batch·(1 + ahead); −1 never waits (the
paper's asynchronous workers). With ahead = 0 and the global batch one round, every worker
waits for the update its gradient is in, and GBA is BSP.
"""

from __future__ import annotations

import dataclasses

from stalebench.algorithms.base import BARRIERS, Barrier, BarrierConfig
from stalebench.errors import ConfigError


@dataclasses.dataclass
class GBAConfig(BarrierConfig):
    apply: str = "per_round"  # the global batch's gradients are averaged into one update
    global_batch: int = 0  # gradients per update; 0 = cluster.num_workers
    threshold: int = 2  # staleness kept at full weight
    decay: float = 0.0  # λ: weight λ^(τ − threshold) beyond it; 0 drops the gradient
    ahead: int = -1  # global batches under way beyond the open one; −1 = never wait

    def __post_init__(self) -> None:
        super().__post_init__()
        checks = {
            "apply": (self.apply == "per_round", "must be 'per_round' for gba"),
            "global_batch": (self.global_batch >= 0, "must be >= 0 (0: cluster.num_workers)"),
            "threshold": (self.threshold >= 0, "must be >= 0"),
            "decay": (0.0 <= self.decay <= 1.0, "must be in [0, 1] (0 drops)"),
            "ahead": (self.ahead >= -1, "must be >= -1 (-1: never wait)"),
        }
        for key, (ok, why) in checks.items():
            if not ok:
                raise ConfigError(f"algorithm.barrier.{key} {why}, got {getattr(self, key)!r}")


@BARRIERS.register("gba", GBAConfig)
class GBA(Barrier):
    """Gather a global batch of gradients from whoever is fastest, stale ones weighed by
    the token rule, and apply their mean."""

    gathers = True

    @property
    def global_batch(self) -> int:
        return self.cfg.global_batch or self.num_workers

    def weigh(self, lag: int) -> float:
        over = lag - self.cfg.threshold
        return 1.0 if over <= 0 else self.cfg.decay**over

    def quorum(self, lost_outside: int) -> int:
        return self.global_batch

    def admit_gathered(self, gathered: bool, open_: int, computing: int) -> bool:
        ahead = self.cfg.ahead
        return ahead < 0 or open_ + computing < self.global_batch * (1 + ahead)
