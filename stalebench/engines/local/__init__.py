"""engine=local: local-update training. Every worker takes H steps of its inner optimizer on
its own replica, then the replicas are reconciled by the outer rule (local SGD, DiLoCo,
EASGD, LSGD: `algorithm/inner=`, `algorithm/outer=`).

`round` holds what both runtimes share (a replica, the wire format, the exchange's
arithmetic); `real` runs it in one process per worker over gloo all-reduces, `sim` on the
virtual clock."""

from __future__ import annotations

import dataclasses
from typing import Any

from stalebench.engines.base import ENGINES, Engine, EngineConfig
from stalebench.engines.local.round import WIRES
from stalebench.errors import ConfigError

MODES = ("sync",)


@dataclasses.dataclass
class LocalConfig(EngineConfig):
    # sync: every H steps all workers exchange by all-reduce and apply the outer rule
    mode: str = "sync"
    # what a pseudo-gradient travels as: none (float32), fp16 (pre-divided by the number
    # of workers, summed in half precision)
    quantize: str = "none"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"engine.mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.quantize not in WIRES:
            raise ConfigError(
                f"engine.quantize must be one of {', '.join(WIRES)}, got {self.quantize!r}"
            )


@ENGINES.register("local", LocalConfig)
class LocalEngine(Engine):
    """N workers take H local steps each, then reconcile their replicas (local SGD, DiLoCo)."""

    slots = ("inner", "outer")

    def validate(self, splits) -> None:
        super().validate(splits)
        a, n = self.run.algorithm, self.num_workers
        alpha = getattr(a.outer, "alpha", 0.0)
        if alpha * n > 1:
            raise ConfigError(
                f"algorithm.outer.alpha={alpha} with cluster.num_workers={n}: the centre moves "
                f"by N·α = {alpha * n:g} > 1 of the replicas' spread and overshoots; use "
                f"alpha <= {1 / n:g} (0 = 0.9/N)"
            )
        groups = getattr(a.outer, "groups", 1)
        if groups > n:
            raise ConfigError(
                f"algorithm.outer.groups={groups} exceeds cluster.num_workers={n}: every group "
                "needs a worker"
            )
        self.check_shards(splits)

    def run_rank(self, job, rank: int, ctx) -> dict[str, Any] | None:
        from stalebench.engines.local.real import worker

        return worker(job, rank, ctx.run_dir, ctx.transport)

    def simulate(self, job, run_dir) -> dict[str, Any]:
        from stalebench.engines.local.sim import simulate

        return simulate(job, run_dir)
