"""The engine contract: how a run trains, as one registered class.

An engine is chosen by `engine=<name>` and registered like a barrier or an update rule:

    @ENGINES.register("sequential", EngineConfig)
    class Sequential(Engine):
        ...

It answers a small fixed set of questions, and the runtimes ask nothing else:

- `validate(splits)`: everything about the input it can refuse, before any process starts
  (the base checks the algorithm's config slots it reads and the cluster fields it cannot
  model, by name);
- `world_size()` and `rank_name(rank)`: the processes of a real run and how errors name
  them (`takes_spares`: whether it runs `cluster.spares` standby workers too;
  `takes_quorum`: whether its ranks regroup without a lost one, `cluster.min_replicas`);
  `num_workers`: those that compute; `one_stream`: whether they read one stream of data
  over the whole split (a pipeline) instead of a shard each;
- `program(job, world)`: what one rank does, written once for both runtimes against the
  world it sees (`stalebench.runtime.world`): rank 0 owns the run directory
  (`world.record`) and returns the summary, the others return None. The real runtime runs
  one rank per process, the simulator every rank in one process on a virtual clock.

The runtime gives every engine the cluster profile: a transport that pays the profile's
network delays, the worker's faults, and its step times (`stalebench.runtime.faults`).
An engine that cannot apply a profile field lists it in `ignores` and is refused with it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from stalebench.config import ENGINES, EngineConfig, RunConfig
from stalebench.errors import ConfigError

if TYPE_CHECKING:
    from stalebench.data import Splits
    from stalebench.job import Job
    from stalebench.runtime.driver import Role
    from stalebench.runtime.world import Op, World

__all__ = ["ENGINES", "NETWORK", "Engine", "EngineConfig"]

# the cluster profile's network: an engine without messages between its processes ignores it
# the network's settings, a topology's among them
NETWORK = (
    "push_latency_ms", "pull_latency_ms", "push_bandwidth_gbps", "pull_bandwidth_gbps",
    "rack_size", "region_size",
)  # fmt: skip


class Engine:
    # the algorithm's parts this engine reads (`registry.PARTS`), each of which must be set,
    # in the order a run's label names them (`<barrier>+<update>`)
    slots: tuple[str, ...] = ("barrier", "update")
    # ClusterConfig fields this engine cannot model: a run that sets one is refused
    ignores: tuple[str, ...] = ()
    # whether a spare worker (cluster.spares) can take a lost worker's place
    takes_spares = False
    # whether its rounds can go on over the replicas left (cluster.min_replicas)
    takes_quorum = False
    # the runtimes it runs in
    runtimes: tuple[str, ...] = ("real", "sim")
    # the runtimes it keeps checkpoints in (every checkpoint_every_s; resume=true goes on
    # from the last one)
    checkpoints: tuple[str, ...] = ()
    # whether it runs cost-only (sim.numerics=false): its messages split into the words it
    # reads (real) and a payload without values (`runtime.wire.Message`)
    cost_only = False
    one_stream = False
    # the modules of its programs, imported (`load_programs`) before a checkpoint is read:
    # they mark the classes its state holds (registry.stored); registering an engine does
    # not import them (nor torch)
    program_modules: tuple[str, ...] = ()

    def __init__(self, cfg: EngineConfig, run: RunConfig):
        self.cfg, self.run = cfg, run

    @property
    def name(self) -> str:
        return self.cfg.name

    @property
    def num_workers(self) -> int:
        return self.run.cluster.num_workers

    @classmethod
    def load_programs(cls) -> None:
        """Import its programs' modules (`program_modules`)."""
        import importlib

        for name in cls.program_modules:
            importlib.import_module(name)

    def world_size(self) -> int:
        """Its processes: by default the N workers, then the spares if it takes them."""
        return self.num_workers + (self.run.cluster.spares if self.takes_spares else 0)

    def rank_name(self, rank: int) -> str:
        n = self.num_workers
        return f"worker {rank} (rank {rank})" if rank < n else f"spare {rank - n} (rank {rank})"

    def survives_loss_of(self, rank: int) -> bool:
        """Does the run go on when this rank dies? (The engine then records the loss; by
        default a dead rank fails the run.)"""
        return False

    def check_cost_only(self) -> None:
        """sim.numerics=false: refused where no value-free run exists (the real runtime, an
        engine that needs its messages' values, checkpoints of values never computed)."""
        run, name = self.run, self.name
        if run.runtime != "sim":
            raise ConfigError(
                f"sim.numerics=false runs in runtime=sim only (a cost-only run computes no "
                f"value; real processes do), got runtime={run.runtime}"
            )
        if not self.cost_only:
            able = ", ".join(ENGINES.names_with("cost_only")) or "none"
            raise ConfigError(
                f"sim.numerics=false: engine={name} does not run cost-only (engines that do: "
                f"{able})"
            )
        if run.checkpoint_every_s:
            raise ConfigError(
                f"checkpoint_every_s={run.checkpoint_every_s:g}: a cost-only run "
                "(sim.numerics=false) has no values to save"
            )

    def why_no_checkpoints(self) -> str | None:
        """Why this run can keep no checkpoints, or None when it keeps them."""
        if self.run.runtime not in self.checkpoints:
            return f"engine={self.name} keeps none in runtime={self.run.runtime}"
        return None

    def validate(self, splits: Splits) -> None:
        """Refuse what this engine cannot run, naming the key and value; the base checks
        the runtime, checkpoints asked for, the algorithm slots and the cluster fields in
        `ignores`."""
        run, name = self.run, self.name
        if run.runtime not in self.runtimes:
            raise ConfigError(
                f"runtime={run.runtime}: engine={name} runs in {', '.join(self.runtimes)}"
            )
        if run.checkpoint_every_s and (why := self.why_no_checkpoints()):
            raise ConfigError(
                f"checkpoint_every_s={run.checkpoint_every_s:g}: {why} (set it to 0, or leave "
                "it unset)"
            )
        if not run.sim.numerics:
            self.check_cost_only()
        if run.runtime == "sim" and run.cluster.compute_ms <= 0:
            raise ConfigError(
                "runtime=sim needs a step time: set cluster.compute_ms > 0 (virtual ms per step)"
            )
        for slot in self.slots:
            if getattr(run.algorithm, slot) is None:
                sets = ", ".join(f"algorithm.{f}" for f in self.set_slots()) or "none of them"
                raise ConfigError(
                    f"engine={name} needs algorithm.{slot}, which algorithm="
                    f"{run.algorithm.name or '?'} does not set (it sets {sets}): choose a "
                    f"preset made for engine={name}, or another engine"
                )
        if run.cluster.spares and not self.takes_spares:
            raise ConfigError(
                f"cluster.spares={run.cluster.spares}: engine={name} cannot hand a lost "
                "worker's place to a spare; engine=ps can, and engine=allreduce, local or gossip "
                "with cluster.min_replicas"
            )
        if run.cluster.min_replicas and not self.takes_quorum:
            raise ConfigError(
                f"cluster.min_replicas={run.cluster.min_replicas}: engine={name} has no rounds "
                "to go on with the replicas left; engine=allreduce, local and gossip have"
            )
        for key in self.ignores:
            value = getattr(run.cluster, key)
            if value:
                raise ConfigError(
                    f"cluster.{key}={value}: engine={name} does not model this; leave it unset "
                    f"(cluster=homogeneous)"
                )

    def check_shards(self, splits: Splits) -> None:
        """Every worker's shard holds a minibatch (for engines with a shard per worker)."""
        n_train, n, batch = len(splits.y_train), self.num_workers, self.run.dataset.batch_size
        if n_train < batch:
            raise ConfigError(f"dataset.batch_size={batch} exceeds the {n_train} training samples")
        if self.run.dataset.sharding == "disjoint" and n_train // n < batch:
            raise ConfigError(
                f"dataset.batch_size={batch} exceeds a worker's shard of {n_train // n} "
                f"samples ({n_train} training samples over cluster.num_workers={n}); "
                "dataset.sharding=replicated lets every worker sample the whole split"
            )
        if self.run.dataset.sharding == "dirichlet":
            from stalebench.data.sharding import dirichlet_shards

            d = self.run.dataset
            shards = dirichlet_shards(splits.y_train, n, d.dirichlet_alpha, self.run.seed)
            worker = min(range(n), key=lambda w: len(shards[w]))
            if len(shards[worker]) < batch:
                raise ConfigError(
                    f"dataset.dirichlet_alpha={d.dirichlet_alpha} leaves worker {worker} "
                    f"{len(shards[worker])} samples, less than dataset.batch_size={batch}: "
                    "raise the concentration, or lower the batch size or cluster.num_workers"
                )

    def set_slots(self) -> list[str]:
        a = self.run.algorithm
        return [f.name for f in dataclasses.fields(a) if f.name != "name" and getattr(a, f.name)]

    def role(self, job: Job, world: World) -> Role:
        """What rank `world.rank` plays, built off the clock (`stalebench.runtime.driver`:
        the role supplies its steps and exchanges, the driver its life)."""
        raise NotImplementedError(f"engine={self.name} has no role")

    def program(self, job: Job, world: World) -> Op[dict[str, Any] | None]:
        """One rank's program: its role's life (`driver.drive`); the recording rank returns
        the run's summary."""
        from stalebench.runtime.driver import drive

        return drive(self.role(job, world), world)
