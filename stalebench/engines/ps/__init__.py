"""engine=ps: a parameter server (rank 0) and N workers (ranks 1..N).

The server is a pure state machine (`state`) fed by its loop (`loop.serve`); the server's
and the workers' programs (`program`) run in both runtimes. Which algorithm runs is the
barrier's and the update rule's business."""

from __future__ import annotations

from stalebench.algorithms.base import BARRIERS
from stalebench.engines.base import ENGINES, EngineConfig
from stalebench.engines.parallel import DataParallel
from stalebench.engines.ps.state import ParameterServer, Push, Reply
from stalebench.errors import ConfigError

__all__ = ["ParameterServer", "ParameterServerEngine", "Push", "Reply"]


@ENGINES.register("ps", EngineConfig)
class ParameterServerEngine(DataParallel):
    """A parameter server (rank 0) applies the workers' gradients; N workers (ranks 1..N),
    and `cluster.spares` standby workers after them."""

    program_modules = ("stalebench.engines.ps.program",)

    takes_spares = True
    # its server applies each gradient as it arrives, weighed by its minibatch, and re-forms
    # a barrier over the workers left
    provides = frozenset({"arrivals", "batch_sizes", "reform"})
    checkpoints = ("real",)  # the server's state (its workers start again from it)
    cost_only = True  # a message's header with values, its payload without (`Header`)

    def validate(self, splits) -> None:
        super().validate(splits)
        c, barrier = self.run.cluster, self.run.algorithm.barrier
        if c.spares and not BARRIERS.get(barrier.name)[0].tolerates_loss:
            raise ConfigError(
                f"cluster.spares={c.spares}: a spare takes a lost worker's place only under a "
                f"barrier that never waits (asp and the update rules on it), not "
                f"algorithm.barrier={barrier.name}"
            )

    def world_size(self) -> int:
        return self.num_workers + 1 + self.run.cluster.spares

    def serves(self, rank: int) -> bool:
        return rank == 0

    def rank_name(self, rank: int) -> str:
        if rank == 0:
            return "server (rank 0)"
        if rank > self.num_workers:
            return f"spare {rank - 1 - self.num_workers} (rank {rank})"
        return f"worker {rank - 1} (rank {rank})"

    def survives_loss_of(self, rank: int) -> bool:
        """A worker, under a barrier that never waits for one (ASP and the update rules on
        it), or one re-formed over the survivors (on_loss=reform): the server goes on with
        the others. A dead server always ends the run."""
        cfg = self.run.algorithm.barrier
        barrier, _ = BARRIERS.get(cfg.name)
        return rank > 0 and barrier.survives_loss(cfg)

    def role(self, job, world):
        from stalebench.engines.ps.program import Server, Worker

        return (Server if world.rank == 0 else Worker)(job, world)
