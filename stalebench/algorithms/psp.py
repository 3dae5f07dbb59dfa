"""PSP: SSP's barrier applied to a random sample of workers (docs/algorithms.md §6)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from stalebench.algorithms.base import BARRIERS, Barrier, BarrierConfig
from stalebench.errors import ConfigError

SAMPLE_FROM = ("others", "all")


@dataclasses.dataclass
class PSPConfig(BarrierConfig):
    sample_size: int = 2  # β: workers sampled at each barrier (clamped to the population)
    staleness: int = 0  # s: a sampled worker may lag this many steps (0 = pBSP, > 0 = pSSP)
    # A-PSP-1: sample from the other N − 1 workers, or from all N (possibly itself)
    sample_from: str = "others"
    # A-PSP-2: draw a fresh sample at every re-check while waiting (False = one per step)
    resample_while_waiting: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sample_size < 0:
            raise ConfigError(f"algorithm.barrier.sample_size must be >= 0, got {self.sample_size}")
        if self.staleness < 0:
            raise ConfigError(f"algorithm.barrier.staleness must be >= 0, got {self.staleness}")
        if self.sample_from not in SAMPLE_FROM:
            raise ConfigError(
                f"algorithm.barrier.sample_from must be 'others' or 'all', got {self.sample_from!r}"
            )


@BARRIERS.register("psp", PSPConfig)
class PSP(Barrier):
    """Probabilistic Synchronous Parallel (Wang, Catterall, Mortier, arXiv 1709.07772): a worker
    starts step c unless one of β workers sampled without replacement has completed fewer than
    c − s steps; β = 0 is ASP, β = N − 1 (others) is SSP(s).

    The sample is drawn the first time a step is checked and kept while the worker waits, or
    drawn afresh at every check with `resample_while_waiting`. Draws come from one stream
    seeded by `seed`, so decisions are a function of the seed and the order of checks.
    """

    def __init__(self, cfg: PSPConfig, num_workers: int, seed: int = 0):
        super().__init__(cfg, num_workers, seed)
        self.staleness = cfg.staleness
        self.resample = cfg.resample_while_waiting
        self.include_self = cfg.sample_from == "all"
        population = num_workers if self.include_self else num_workers - 1
        self.sample_size = min(cfg.sample_size, max(population, 0))
        self.rng = random.Random(f"psp/{seed}")  # a named stream: independent of other draws
        self.samples: list[list[int]] = [[] for _ in range(num_workers)]  # current sample
        self.sample_step = [-1] * num_workers  # the step each current sample was drawn for
        self.checked_step = [-1] * num_workers  # the step last asked about
        # pass-through counters: admitted at the first check of a step vs after waiting
        self.admitted_first = 0
        self.admitted_after_wait = 0

    def admit(self, worker: int, clocks: Sequence[int], slowest: int) -> bool:
        step = clocks[worker]
        first = self.checked_step[worker] != step
        self.checked_step[worker] = step
        if self.resample or self.sample_step[worker] != step:
            self.samples[worker] = self._draw(worker)
            self.sample_step[worker] = step
        ok = all(step - clocks[j] <= self.staleness for j in self.samples[worker])
        if ok and first:
            self.admitted_first += 1
        elif ok:
            self.admitted_after_wait += 1
        return ok

    def _draw(self, worker: int) -> list[int]:
        if self.sample_size == 0:
            return []
        peers = [j for j in range(self.num_workers) if self.include_self or j != worker]
        return self.rng.sample(peers, self.sample_size)
