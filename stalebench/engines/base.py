"""The engine contract: how a run trains, as one registered class.

An engine is chosen by `engine=<name>` and registered like a barrier or an update rule:

    @ENGINES.register("sequential", EngineConfig)
    class Sequential(Engine):
        ...

It answers a small fixed set of questions, and the runtimes ask nothing else:

- `validate(splits)`: everything about the input it can refuse, before any process starts
  (the base checks that the algorithm's parts it reads are set, each part's own fields
  against the run (`registry.Part.check`), what a part needs of an engine against what this
  one `provides` (`Part.needs`), spares and min_replicas, and the cluster fields it cannot
  model, by name);
- `world_size()` and `rank_name(rank)`: the processes of a real run and how errors name
  them (`takes_spares`: whether it runs `cluster.spares` standby workers too;
  `takes_quorum`: whether its ranks regroup without a lost one, `cluster.min_replicas`);
  `num_workers`: those that compute; `one_stream`: whether they read one stream of data
  over the whole split (a pipeline) instead of a shard each;
- `role(job, world)`: what one rank plays (`stalebench.runtime.driver.Role`), written once
  for both runtimes against the world it sees (`stalebench.runtime.world`); the base
  `program(job, world)` drives it (the start, errors and lost workers, and on rank 0, which
  owns the run directory, `world.record`, the summary it returns). The real runtime runs
  one rank per process, the simulator every rank in one process on a virtual clock.

The runtime gives every engine the cluster profile: a transport that pays the profile's
network delays, the worker's faults, and its step times (`stalebench.runtime.faults`).
An engine that cannot apply a profile field lists it in `ignores` and is refused with it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from stalebench.config import ENGINES, EngineConfig, RunConfig
from stalebench.errors import ConfigError
from stalebench.registry import NEEDS, Part, part_class

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
    # whether its rounds can go on over the replicas left (cluster.min_replicas); with
    # takes_spares, a spare joins those rounds, so spares need min_replicas
    takes_quorum = False
    # what it gives the algorithm's parts (keys of `registry.NEEDS`): a part that needs
    # anything else (`Part.needs`) is refused, by name
    provides: frozenset[str] = frozenset()
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

    def why_not(self, setting: str) -> str | None:
        """Why its programs cannot honour `setting` of the workers' real compute, if they
        cannot: `compile=true` (by default they compute through `engines.common.compiled`)
        or `precision=fp16` (by default each gradient through `precision.grads_of`, with
        its worker's loss scale)."""
        return None

    def serves(self, rank: int) -> bool:
        """Is `rank` a server: it keeps θ and applies updates, but computes no gradient? A
        server keeps its state on `server_device` (`Job.device`); by default no rank does."""
        return False

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
        the runtime, checkpoints asked for, the algorithm slots (`check_parts`), spares and
        min_replicas (`check_spares`) and the cluster fields in `ignores`."""
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
        self.check_spares()
        if run.server_device == "cuda" and not any(map(self.serves, range(self.world_size()))):
            raise ConfigError(
                f"server_device=cuda: engine={name} has no server (its ranks compute on "
                "`device`); leave server_device unset"
            )
        for setting, asked, instead in (
            ("compile=true", run.compile, "leave compile unset"),
            ("precision=fp16", run.precision == "fp16", "use precision=bf16"),
        ):
            if asked and (why := self.why_not(setting)):
                raise ConfigError(f"{setting}: {why}; {instead}")
        for key in self.ignores:
            value = getattr(run.cluster, key)
            if value:
                raise ConfigError(
                    f"cluster.{key}={value}: engine={name} does not model this; leave it unset "
                    f"(cluster=homogeneous)"
                )
        self.check_parts()

    def check_spares(self) -> None:
        """cluster.spares and cluster.min_replicas, by `takes_spares` and `takes_quorum`: an
        engine that takes both hands a lost worker's place to a spare in its rounds over the
        replicas left, so its spares need min_replicas."""
        c, name = self.run.cluster, self.name
        if c.spares and not self.takes_spares:
            raise ConfigError(
                f"cluster.spares={c.spares}: engine={name} cannot hand a lost "
                "worker's place to a spare; engine=ps can, and engine=allreduce, local or gossip "
                "with cluster.min_replicas"
            )
        if c.min_replicas and not self.takes_quorum:
            raise ConfigError(
                f"cluster.min_replicas={c.min_replicas}: engine={name} has no rounds "
                "to go on with the replicas left; engine=allreduce, local and gossip have"
            )
        if c.spares and self.takes_quorum and not c.min_replicas:
            raise ConfigError(
                f"cluster.spares={c.spares}: engine={name} hands a lost worker's place to a "
                "spare in rounds that go on over the replicas left: set cluster.min_replicas too"
            )

    def parts(self) -> Iterator[tuple[str, Any, type]]:
        """The algorithm's parts this engine reads, in `slots` order: (slot, config, class)."""
        for slot in self.slots:
            cfg = getattr(self.run.algorithm, slot)
            yield slot, cfg, part_class(slot, cfg)

    def check_parts(self) -> None:
        """Each part checks its own fields against the run (`Part.check`), then is refused
        if it needs of this engine what the engine does not give (`Part.needs`, `provides`)."""
        parts = [(slot, cfg, cls) for slot, cfg, cls in self.parts() if issubclass(cls, Part)]
        for _, cfg, cls in parts:
            cls.check(cfg, self.num_workers, self.run)
        for slot, cfg, cls in parts:
            for need, setting in cls.needs(cfg).items():
                if need not in self.provides:
                    raise ConfigError(self.refusal(slot, cfg, need, setting))

    def refusal(self, slot: str, cfg: Any, need: str, setting: str) -> str:
        """Why part `algorithm.<slot>` is refused: it needs `need`, which this engine does not
        give; the engines that give it, and read that slot, are named."""
        engines = {n: ENGINES.get(n)[0] for n in ENGINES.names()}
        able = [n for n, e in engines.items() if need in e.provides and slot in e.slots]
        part = f"algorithm.{slot}={cfg.label}" + (f" with {setting}" if setting else "")
        fix = f"use engine={', '.join(able)}" if able else "no engine registered gives it"
        if setting:
            fix += f", or leave algorithm.{slot}.{setting.partition('=')[0]} at its default"
        return (
            f"{part} needs {NEEDS.get(need, need)}, which engine={self.name} does not give: {fix}"
        )

    def needed(self, need: str) -> str | None:
        """How the part that needs `need` says it (`algorithm.<slot>.<key>=<value>`, or
        `algorithm.<slot>=<name>` when the part needs it whatever its settings), or None when
        no part does: for a check of this engine's own that follows from the need."""
        for slot, cfg, cls in self.parts():
            setting = cls.needs(cfg).get(need) if issubclass(cls, Part) else None
            if setting is not None:
                return f"algorithm.{slot}.{setting}" if setting else f"algorithm.{slot}={cfg.label}"
        return None

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
