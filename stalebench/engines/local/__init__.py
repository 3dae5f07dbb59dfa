"""engine=local: local-update training. Every worker takes H steps of its inner optimizer on
its own replica, then the replicas are reconciled by the outer rule (local SGD, DiLoCo,
EASGD, LSGD: `algorithm/inner=`, `algorithm/outer=`).

`round` holds the arithmetic (a replica, the wire format, the exchange); `program` is a
worker of the collective modes and `server` the asynchronous mode's server and worker,
each written once for both runtimes."""

from __future__ import annotations

import dataclasses

from stalebench.algorithms.local import OUTER
from stalebench.engines.base import ENGINES, Engine, EngineConfig
from stalebench.engines.local.wire import QUANTIZE
from stalebench.errors import ConfigError

MODES = ("sync", "streaming", "overlap", "async")


@dataclasses.dataclass
class LocalConfig(EngineConfig):
    # sync: every H steps all workers exchange by all-reduce and apply the outer rule;
    # streaming: Streaming DiLoCo, θ in `fragments` parts sent at staggered steps, each
    # merged `delay` steps after it was sent (the all-reduce overlaps those steps) and
    # mixed with the replica by `alpha`; overlap: HPSGD, a round's exchange runs during the
    # next round's H steps and its change is added to the replica when it arrives; async:
    # a server (rank 0) applies each worker's Δ when it arrives (asynchronous local SGD)
    mode: str = "sync"
    fragments: int = 1  # P (streaming)
    delay: int = 0  # τ, inner steps from a fragment's send to its merge (streaming)
    alpha: float = 0.0  # x ← (1 − α)·θ + α·x at a merge (streaming); 0: take θ
    # async: dynamic local updates, each worker's H proportional to its measured speed
    dynamic_local: bool = False
    # what a pseudo-gradient travels as: none (float32), fp16 (pre-divided by the number
    # of workers, summed in half precision), int8 (a float32 scale per model tensor;
    # all-gathered, since int8 values with different scales cannot be summed on the wire)
    quantize: str = "none"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"engine.mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.quantize not in QUANTIZE:
            raise ConfigError(
                f"engine.quantize must be one of {', '.join(QUANTIZE)}, got {self.quantize!r}"
            )
        if self.fragments < 1:
            raise ConfigError(f"engine.fragments must be >= 1, got {self.fragments}")
        if self.delay < 0:
            raise ConfigError(f"engine.delay must be >= 0, got {self.delay}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(f"engine.alpha must be in [0, 1], got {self.alpha}")
        owners = {"fragments": (1, "streaming"), "delay": (0, "streaming")}
        owners |= {"alpha": (0.0, "streaming"), "dynamic_local": (False, "async")}
        for key, (default, mode) in owners.items():
            if self.mode != mode and getattr(self, key) != default:
                raise ConfigError(
                    f"engine.{key}={getattr(self, key)} is a setting of engine.mode={mode}, "
                    f"not of engine.mode={self.mode}"
                )


@ENGINES.register("local", LocalConfig)
class LocalEngine(Engine):
    """N workers take H local steps each, then reconcile their replicas (local SGD, DiLoCo)."""

    program_modules = ("stalebench.engines.local.program", "stalebench.engines.local.server")

    slots = ("outer", "inner")  # in label order: `<outer>+<inner>`
    takes_quorum = True  # the collective modes with a mean exchange (`validate`)
    takes_spares = True  # with cluster.min_replicas
    provides = frozenset({"rounds"})  # H inner steps, then an exchange
    checkpoints = ("real", "sim")  # every worker's part, after a step's merges
    cost_only = True  # the payloads without values; the statistics and headers with them

    def why_no_checkpoints(self) -> str | None:
        e = self.run.engine
        if self.asynchronous:
            return "engine.mode=async keeps none"
        if e.mode == "overlap" or e.delay:
            delay = f" with engine.delay={e.delay}" if e.mode == "streaming" else ""
            return (
                f"engine.mode={e.mode}{delay}: an exchange is always in flight (checkpoints "
                "need engine.mode=sync, or streaming with engine.delay=0)"
            )
        return super().why_no_checkpoints()

    @property
    def asynchronous(self) -> bool:
        return self.run.engine.mode == "async"

    def world_size(self) -> int:
        return self.num_workers + (1 if self.asynchronous else self.run.cluster.spares)

    def survives_loss_of(self, rank: int) -> bool:
        """A worker, in the asynchronous mode (nobody waits for it): the server goes on with
        the others; in the collective modes with cluster.min_replicas, the rounds go on over
        the replicas left (rank 0, which writes the run directory, cannot be lost). A sync round
        otherwise needs every replica; a dead server ends the run."""
        return rank > 0 and (self.asynchronous or self.run.cluster.min_replicas > 0)

    def serves(self, rank: int) -> bool:
        return self.asynchronous and rank == 0

    def rank_name(self, rank: int) -> str:
        if not self.asynchronous:
            return super().rank_name(rank)
        return "server (rank 0)" if rank == 0 else f"worker {rank - 1} (rank {rank})"

    def validate(self, splits) -> None:
        super().validate(splits)
        a = self.run.algorithm
        e, steps = self.run.engine, a.outer.inner_steps
        if e.mode == "streaming" and (steps % e.fragments or e.delay > steps // e.fragments):
            raise ConfigError(
                f"engine.fragments={e.fragments}, engine.delay={e.delay} with "
                f"algorithm.outer.inner_steps={steps}: the fragments must divide H and a "
                f"fragment's merge come no later than the next fragment's send "
                f"(delay <= H/fragments = {steps // e.fragments})"
            )
        leads = OUTER.get(a.outer.name)[0].exchange != "mean"
        if leads and e.quantize == "int8":
            raise ConfigError(
                f"engine.quantize=int8: algorithm.outer={a.outer.name} sends only its leaders' "
                "Δ, which an all-gather of every worker's piece would not carry; use none or fp16"
            )
        if e.mode != "sync" and leads:
            raise ConfigError(
                f"engine.mode={e.mode}: algorithm.outer={a.outer.name} picks leaders from the "
                "round's losses before it sends; it runs with engine.mode=sync only"
            )
        quorum = self.run.cluster.min_replicas
        if quorum and (leads or e.quantize == "int8"):
            what = f"algorithm.outer={a.outer.name}" if leads else f"engine.quantize={e.quantize}"
            raise ConfigError(
                f"cluster.min_replicas={quorum}: {what} cannot go on over the replicas left "
                "(a rule that averages, with quantize none or fp16, can)"
            )
        spares = self.run.cluster.spares
        if spares and (e.mode == "overlap" or e.delay):
            delay = f" with engine.delay={e.delay}" if e.mode == "streaming" else ""
            raise ConfigError(
                f"cluster.spares={spares}: engine.mode={e.mode}{delay} has an exchange in "
                "flight at every merge, which a spare joining then would not be part of "
                "(spares join engine.mode=sync, or streaming with engine.delay=0)"
            )
        self.check_shards(splits)

    def role(self, job, world):
        from stalebench.engines.local import program, server

        if not self.asynchronous:
            return program.Member(job, world)
        return (server.Server if world.rank == 0 else server.Worker)(job, world)
