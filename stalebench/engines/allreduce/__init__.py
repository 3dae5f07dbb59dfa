"""engine=allreduce: BSP the way DDP does it. Every rank holds a replica, averages the
round's gradients with one all-reduce, and takes the same local optimizer step (the
configured update rule with the mean gradient, worker −1, lag 0). Rank 0 writes the run
directory.

A replica is one role (`replica.Replica`) in both runtimes: one all-reduce per round carries
the gradient and, in a tail of 3·N + 1 slots, each rank's compute time, loss and seconds
paused and rank 0's stop flag, so all replicas stop on the same round. The cluster
profile's network is paid by the world (a ring all-reduce of that whole message per
round), its faults and step times by the compute step.

`engine.bucket_mb > 0` sends the round in pieces that overlap backward, and with
`engine.schedule=p3` the next forward pass too (`Rounds`, stalebench.engines.overlap): in
real processes backward hooks post each piece as it is made (`World.pieces`); in the
simulator the round's all-reduce lasts what the buckets take behind the modelled backward
(fifo), or what the next forward pass waits for P3's slices, sent by priority, as it
reaches each layer (p3). Under P3 in real processes a round is applied by layer in the
next round's forward pass, and closed (reported, its stop decided) after that step; in the
simulator it is applied whole at its end, which for the element-wise rules P3 takes is the
θ the forward pass reaches layer by layer.
"""

from __future__ import annotations

import dataclasses

from stalebench.algorithms.base import BARRIERS, UPDATES
from stalebench.engines.base import ENGINES, EngineConfig
from stalebench.engines.parallel import DataParallel
from stalebench.errors import ConfigError

SCHEDULES = ("fifo", "p3")


@dataclasses.dataclass
class AllReduceConfig(EngineConfig):
    # 0: a round is one all-reduce once backward is done; > 0: pieces of about this many MB
    # all-reduced while backward makes the rest (fifo: buckets of whole tensors, as DDP's
    # bucket_cap_mb; p3: every tensor cut into slices of at most this size)
    bucket_mb: float = 0.0
    # fifo: the pieces go as backward makes them, the update once all are in; p3: the made
    # piece nearest the input goes first, and each layer's pieces are applied just before
    # the next forward pass reaches it (needs an element-wise algorithm.update)
    schedule: str = "fifo"
    # hybrid parallelism (`hybrid.Hybrid`): these linear layers (a module's name or its
    # class, e.g. Linear) split over the ranks, their activations exchanged instead of
    # their gradients all-reduced; the simulator prices it (runtime=sim)
    model_parallel: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if self.bucket_mb < 0:
            raise ConfigError(f"engine.bucket_mb must be >= 0, got {self.bucket_mb}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(
                f"engine.schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}"
            )
        if self.schedule == "p3" and not self.bucket_mb:
            raise ConfigError(
                "engine.schedule=p3 sends θ in slices of engine.bucket_mb: set it > 0 "
                "(P3's slices are a few hundred kB)"
            )


@ENGINES.register("allreduce", AllReduceConfig)
class AllReduceEngine(DataParallel):
    """N replicas average each round's gradients by one all-reduce (BSP the way DDP does it)."""

    program_modules = ("stalebench.engines.allreduce.replica",)

    takes_quorum = True
    takes_spares = True  # with cluster.min_replicas: a spare takes a lost replica's place
    checkpoints = ("real", "sim")  # every replica's part at a round's end
    cost_only = True  # a round's message: its tail with values, the gradient without

    def why_no_checkpoints(self) -> str | None:
        if self.cfg.bucket_mb and self.run.runtime == "real":
            return f"engine.bucket_mb={self.cfg.bucket_mb:g}: the rounds in pieces keep none"
        return super().why_no_checkpoints()

    def why_not(self, setting: str) -> str | None:
        if not self.cfg.bucket_mb:
            return None
        if setting == "compile=true":
            return (f"engine.bucket_mb={self.cfg.bucket_mb:g}: the rounds in pieces hook the "
                    "model's forward and backward, which run eager")  # fmt: skip
        return (f"engine.bucket_mb={self.cfg.bucket_mb:g}: a piece is all-reduced as backward "
                "makes it, before an overflow anywhere in the gradient is known")  # fmt: skip

    def check_model_parallel(self, splits) -> None:
        """engine.model_parallel: the simulator prices it, P3's layer-by-layer rounds do
        not take it, and it names linear layers of the model (built on the meta device)."""
        import torch

        from stalebench.engines.allreduce.hybrid import Hybrid
        from stalebench.job import build_model

        layers = list(self.cfg.model_parallel)
        if self.run.runtime != "sim":
            raise ConfigError(
                f"engine.model_parallel={layers}: model-parallel layers are priced by the "
                "simulator (runtime=sim); real processes would exchange the activations, "
                "which engine=allreduce does not do"
            )
        if self.cfg.schedule == "p3":
            raise ConfigError(f"engine.model_parallel={layers}: not with engine.schedule=p3")
        with torch.device("meta"):
            Hybrid.of(build_model(self.run, splits), layers, self.run.dataset.batch_size)

    def survives_loss_of(self, rank: int) -> bool:
        """A replica, with cluster.min_replicas set: the rounds go on over the others (rank
        0 writes the run directory: losing it ends the run)."""
        return rank > 0 and self.run.cluster.min_replicas > 0

    def validate(self, splits) -> None:
        super().validate(splits)
        if self.cfg.schedule == "p3":
            update = self.run.algorithm.update.name
            if not UPDATES.get(update)[0].elementwise:
                elementwise = UPDATES.names_with("elementwise")
                raise ConfigError(
                    f"engine.schedule=p3 applies each slice as it arrives, which needs an "
                    f"element-wise rule: algorithm.update={update} is not (use one of "
                    f"{', '.join(elementwise)})"
                )
        if self.cfg.model_parallel:
            self.check_model_parallel(splits)
        barrier = self.run.algorithm.barrier.name
        if not BARRIERS.get(barrier)[0].synchronous:
            sync = BARRIERS.names_with("synchronous")
            raise ConfigError(
                f"engine=allreduce is synchronous: algorithm.barrier must be one of "
                f"{', '.join(sync)}, got {barrier!r}"
            )
        if self.run.cluster.min_replicas and self.cfg.bucket_mb and self.run.runtime == "real":
            raise ConfigError(
                f"cluster.min_replicas={self.run.cluster.min_replicas}: engine.bucket_mb="
                f"{self.cfg.bucket_mb} sends a round in pieces, which cannot go on over the "
                "replicas left (set engine.bucket_mb=0, or runtime=sim)"
            )

    def role(self, job, world):
        from stalebench.engines.allreduce.replica import Replica

        return Replica(job, world)
