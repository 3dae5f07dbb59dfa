"""Barriers of the parameter-server family: BSP, ASP, SSP (docs/algorithms.md §2–§4)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

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
    # b backup workers (Chen et al. 2016): a round applies the mean of the first N − b
    # gradients computed on its θ and drops the rest; 0 = wait for every worker
    backups: int = 0
    # DBS (Ye et al. 2020): every this many rounds, each worker's minibatch size becomes
    # proportional to its measured throughput, the global batch N·B kept; 0 = fixed sizes
    rebalance_every: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backups < 0:
            raise ConfigError(f"algorithm.barrier.backups must be >= 0, got {self.backups}")
        if self.rebalance_every < 0:
            raise ConfigError(
                f"algorithm.barrier.rebalance_every must be >= 0, got {self.rebalance_every}"
            )
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
    gathers = True

    @classmethod
    def needs(cls, cfg: BSPConfig) -> dict[str, str]:
        """Backup workers drop a round's last gradients: each must arrive on its own; DBS's
        minibatches of different sizes must each be weighed by its size."""
        needs = super().needs(cfg)
        if cfg.backups:
            needs["arrivals"] = f"backups={cfg.backups}"
        if cfg.rebalance_every:
            needs["batch_sizes"] = f"rebalance_every={cfg.rebalance_every}"
        return needs

    @classmethod
    def check(cls, cfg: BSPConfig, num_workers: int, run: Any = None) -> None:
        super().check(cfg, num_workers, run)
        if cfg.backups >= num_workers:
            raise ConfigError(
                f"algorithm.barrier.backups={cfg.backups} with cluster.num_workers={num_workers}"
                f": a round needs at least one gradient (backups <= {num_workers - 1})"
            )

    @property
    def staleness(self) -> int:
        return 0

    def weigh(self, lag: int) -> float:
        """A gradient of an earlier round arrives after its round was applied: dropped."""
        return 1.0 if lag == 0 else 0.0

    def quorum(self, lost_outside: int) -> int:
        """N − b, less the lost workers that did not push this round (on_loss=reform)."""
        return max(1, self.num_workers - self.cfg.backups - lost_outside)

    def rebalance(
        self, version: int, samples: list[int], seconds: list[float], sizes: list[int]
    ) -> list[int] | None:
        """DBS: every `rebalance_every` rounds, sizes proportional to samples per second."""
        every = self.cfg.rebalance_every
        if not every or version % every or not all(seconds):
            return None
        return proportional(sum(sizes), [n / s for n, s in zip(samples, seconds, strict=True)])


def proportional(total: int, rates: list[float]) -> list[int]:
    """`total` cut into integers >= 1 in proportion to `rates`: each its share rounded down,
    the rest one each to the largest remainders (ties to the lower index); a share raised
    to 1 is paid for by the largest."""
    shares = [total * r / sum(rates) for r in rates]
    sizes = [max(1, int(x)) for x in shares]
    by_remainder = sorted(range(len(rates)), key=lambda i: (int(shares[i]) - shares[i], i))
    for i in by_remainder[: max(0, total - sum(sizes))]:
        sizes[i] += 1
    while sum(sizes) > total:
        sizes[sizes.index(max(sizes))] -= 1
    return sizes


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
