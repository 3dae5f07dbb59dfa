"""engine=gossip: decentralised training, no server. Every node takes a step of its local
optimizer (`algorithm/inner=`) on its own model and mixes it with its peers' by gossip
(`algorithm/gossip=`): Stochastic Gradient Push (PushSum on a time-varying directed
exponential graph), its overlap variant OSGP, and D-PSGD.

A node waits only for the messages its in-peers sent it, never for the slowest node, except
at the engine's own collective every `engine.sync_every` iterations: one all-reduce of the
nodes' de-biased models z_i (their mean z̄ is the model snapshotted and evaluated) and one of
their statistics (each iteration's loss and times, ‖z_i − z̄‖, rank 0's stop decision), so
that rank 0 can write the run directory and every rank stops at the same iteration.

`node` holds a node's state, the statistics and the events; `peer` is a node's program,
one per rank, which both runtimes run.
"""

from __future__ import annotations

import dataclasses

from stalebench.engines.base import ENGINES, Engine, EngineConfig
from stalebench.errors import ConfigError


@dataclasses.dataclass
class GossipConfig(EngineConfig):
    # iterations between the collectives that gather z̄ (snapshots), each node's statistics
    # (events) and the stop decision; every node waits for the slowest there, so a longer
    # period leaves the gossip freer (the run ends on one: up to this many past the budget)
    sync_every: int = 10

    def __post_init__(self) -> None:
        if self.sync_every < 1:
            raise ConfigError(f"engine.sync_every must be >= 1, got {self.sync_every}")


@ENGINES.register("gossip", GossipConfig)
class GossipEngine(Engine):
    """N nodes train decentralised: a local step, then gossip with their peers (SGP, D-PSGD)."""

    program_modules = ("stalebench.engines.gossip.peer",)

    slots = ("gossip", "inner")  # in label order: `<mixing>+<inner>`
    checkpoints = ("real", "sim")  # every node's part, after a meeting
    takes_quorum = True  # a lost node's peers keep its share; the meetings go over the rest
    takes_spares = True  # with cluster.min_replicas: a spare plays a lost node from a meeting
    cost_only = True  # a message is all payload ([x | w]): on the meta device, cost-only

    def survives_loss_of(self, rank: int) -> bool:
        """A node, with cluster.min_replicas set (rank 0 writes the run directory: losing
        it ends the run)."""
        return rank > 0 and self.run.cluster.min_replicas > 0

    def why_no_checkpoints(self) -> str | None:
        tau = self.run.algorithm.gossip.overlap
        if tau:
            return (
                f"algorithm.gossip.overlap={tau}: messages are always in flight (checkpoints "
                "need overlap 0)"
            )
        return super().why_no_checkpoints()

    def validate(self, splits) -> None:
        super().validate(splits)
        self.check_shards(splits)

    def role(self, job, world):
        from stalebench.engines.gossip.peer import Peer

        return Peer(job, world)
