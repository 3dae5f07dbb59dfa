"""Cluster profiles: how many workers and how slow each one is.

A worker's emulated compute time per step is `compute_ms × slowdown[i]`; the real runtime
measures the real compute time and sleeps the difference, so a profile slows compute only
(never faster than the hardware). With `compute_ms = 0` only real compute counts.
"""

from __future__ import annotations

import dataclasses
import math

from stalebench.errors import ConfigError
from stalebench.registry import ComponentConfig, Registry


@dataclasses.dataclass
class ClusterConfig(ComponentConfig):
    preset: str = "custom"  # the profile's name in reports (set by conf/cluster presets)
    num_workers: int = 4
    compute_ms: float = 0.0  # emulated compute time of one step on a speed-1 worker (ms)
    # per-worker slowdown multipliers; empty = derive from slow_fraction and slow_factor
    slowdown: list[float] = dataclasses.field(default_factory=list)
    slow_fraction: float = 0.0  # fraction of workers (the last ones) that are slow
    slow_factor: float = 1.0  # how many times slower those workers are

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ConfigError(f"cluster.num_workers must be >= 1, got {self.num_workers}")
        if self.compute_ms < 0:
            raise ConfigError(f"cluster.compute_ms must be >= 0, got {self.compute_ms}")
        if self.slowdown and len(self.slowdown) != self.num_workers:
            raise ConfigError(
                f"cluster.slowdown must list one multiplier per worker "
                f"(cluster.num_workers={self.num_workers}), got {list(self.slowdown)}"
            )
        if any(m < 1.0 for m in self.slowdown):
            raise ConfigError(
                f"cluster.slowdown multipliers must be >= 1, got {list(self.slowdown)}"
            )
        if not 0.0 <= self.slow_fraction <= 1.0:
            raise ConfigError(f"cluster.slow_fraction must be in [0, 1], got {self.slow_fraction}")
        if self.slow_factor < 1.0:
            raise ConfigError(f"cluster.slow_factor must be >= 1, got {self.slow_factor}")


class Profile:
    """Per-worker step-time targets derived from a ClusterConfig."""

    def __init__(self, cfg: ClusterConfig):
        self.cfg = cfg
        if cfg.slowdown:
            self.slowdown = [float(m) for m in cfg.slowdown]
        else:
            n_slow = math.ceil(cfg.slow_fraction * cfg.num_workers)
            fast = cfg.num_workers - n_slow
            self.slowdown = [1.0] * fast + [cfg.slow_factor] * n_slow

    def compute_target_s(self, worker: int) -> float:
        """Seconds one step of `worker` must take (its compute is padded up to this)."""
        return self.cfg.compute_ms * self.slowdown[worker] / 1000.0


CLUSTERS: Registry[Profile] = Registry("cluster profile", "cluster", "cluster")
CLUSTERS.register("profile", ClusterConfig)(Profile)
