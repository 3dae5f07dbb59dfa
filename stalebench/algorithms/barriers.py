"""Barriers of the parameter-server family: BSP, ASP, SSP (docs/algorithms.md §2–§4)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from stalebench.algorithms.base import BARRIERS, Barrier, BarrierConfig
from stalebench.errors import ConfigError


@dataclasses.dataclass
class SSPConfig(BarrierConfig):
    staleness: int = 3  # s: a worker may start step c only if every worker has completed c − s

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.staleness < 0:
            raise ConfigError(f"algorithm.barrier.staleness must be >= 0, got {self.staleness}")


@BARRIERS.register("ssp", SSPConfig)
class SSP(Barrier):
    """Stale Synchronous Parallel (Ho et al., NIPS 2013), eager reads: start step c only
    while c − min_j clock_j ≤ s; s = 0 is BSP's barrier, s = ∞ is ASP."""

    reformable = True

    @property
    def staleness(self) -> int:
        return self.cfg.staleness

    def admit(self, worker: int, clocks: Sequence[int], slowest: int) -> bool:
        return clocks[worker] - slowest <= self.staleness


@dataclasses.dataclass
class BSPConfig(BarrierConfig):
    apply: str = "per_round"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.apply != "per_round":
            raise ConfigError(
                "algorithm.barrier.apply must be 'per_round' for bsp (ssp with staleness=0 "
                f"applies per arrival), got {self.apply!r}"
            )


@BARRIERS.register("bsp", BSPConfig)
class BSP(SSP):
    """Bulk Synchronous Parallel (Valiant 1990; synchronous SGD): every worker waits for the
    round to finish, and the round's gradients are averaged into one update."""

    synchronous = True

    @property
    def staleness(self) -> int:
        return 0


@dataclasses.dataclass
class ASPConfig(BarrierConfig):
    def __post_init__(self) -> None:
        super().__post_init__()
        if self.apply != "per_arrival":
            raise ConfigError(
                f"algorithm.barrier.apply must be 'per_arrival' for asp, got {self.apply!r}"
            )


@BARRIERS.register("asp", ASPConfig)
class ASP(Barrier):
    """Asynchronous Parallel (Hogwild!/Downpour PS form): never wait."""

    tolerates_loss = True

    def admit(self, worker: int, clocks: Sequence[int], slowest: int) -> bool:
        return True
