"""The run's schema: every default lives here; YAML under conf/ only composes."""

from __future__ import annotations

import dataclasses
import ipaddress
import math
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

import stalebench.algorithms  # noqa: F401  (the built-in algorithm parts: registry.PARTS)
from stalebench.cluster import ClusterConfig
from stalebench.data import DatasetConfig
from stalebench.errors import ConfigError
from stalebench.metrics.wandb_mode import MODES as WANDB_MODES
from stalebench.registry import PARTS, ComponentConfig, Registry
from stalebench.sweep import SweepConfig

RUNTIMES = ("real", "sim")
LOGGERS = ("none", "local", "wandb")
EVAL_SPLITS = ("test", "val")  # what eval.split may name


@dataclasses.dataclass
class EngineConfig(ComponentConfig):
    """An engine's config slot (`engine=<name>`): an engine with settings of its own
    registers a subclass; the built-in engines need none."""


# how a run trains (parameter server, all-reduce, pipeline...): stalebench.engines registers
ENGINES: Registry = Registry("engine", "engine", "engine")


@dataclasses.dataclass
class AlgorithmConfig:
    """`algorithm`: the preset's name (empty: the run is labelled by its parts) and an
    optional field per algorithm part declared (`registry.PARTS`: barrier, update, pipeline,
    optimizer, inner, outer, gossip, and any a plugin declares), which `algorithm_schema`
    adds. Each engine's `slots` name the parts it reads."""

    name: str = ""

    def __reduce__(self):  # by value: a process rebuilds it with its own schema
        return _restore_algorithm, (dict(self.__dict__),)


def algorithm_schema() -> type[AlgorithmConfig]:
    """AlgorithmConfig with a field per part declared so far (call it once the plugins are
    loaded: `register_configs`)."""
    key = tuple(PARTS.items())
    if key not in _SCHEMAS:
        # Optional[...] as OmegaConf reads the annotation (it does not read `X | None`)
        fields = [(s, Optional[b], dataclasses.field(default=None)) for s, b in key]  # noqa: UP045
        _SCHEMAS[key] = dataclasses.make_dataclass(
            "AlgorithmConfig", fields, bases=(AlgorithmConfig,), namespace={"__module__": __name__}
        )
    return _SCHEMAS[key]


_SCHEMAS: dict[tuple, type[AlgorithmConfig]] = {}


def _restore_algorithm(fields: dict[str, Any]) -> AlgorithmConfig:
    algorithm = object.__new__(algorithm_schema())
    algorithm.__dict__.update(fields)
    return algorithm


@dataclasses.dataclass
class BudgetConfig:
    max_updates: int = 0  # stop after this many server updates (0 = no limit)
    max_wall_s: float = 20.0  # stop after this many seconds of training (0 = no limit)
    target_accuracy: float = 0.6  # test accuracy for time_to_target_s
    # a completed run whose held-out loss ends above this many times its loss at θ₀ (or
    # not finite: an overflow) is `diverged`, as the papers mean it; 0 = only non-finite
    diverge_factor: float = 10.0

    def __post_init__(self) -> None:
        if self.diverge_factor != 0 and not self.diverge_factor > 1:
            raise ConfigError(
                f"budget.diverge_factor must be 0 (off) or > 1, got {self.diverge_factor}"
            )
        if self.max_updates < 0:
            raise ConfigError(f"budget.max_updates must be >= 0, got {self.max_updates}")
        if self.max_wall_s < 0:
            raise ConfigError(f"budget.max_wall_s must be >= 0, got {self.max_wall_s}")
        if self.max_updates == 0 and self.max_wall_s == 0:
            raise ConfigError("budget: set budget.max_updates or budget.max_wall_s (both are 0)")
        if not 0.0 <= self.target_accuracy <= 1.0:
            raise ConfigError(
                f"budget.target_accuracy must be in [0, 1], got {self.target_accuracy}"
            )


SIM_BATCH = ("auto", "on", "off")


@dataclasses.dataclass
class SimConfig:
    """The simulator's own settings (runtime=sim); none changes what a run simulates, only
    how fast, except `batch`, whose batched gradients equal one-at-a-time ones to float
    rounding (docs/design.md, "Batched gradients")."""

    # compute the workers' pending gradients together (one vmapped forward and backward
    # over their parameter versions): on, off, or auto — on where it pays: a model of at
    # most batch_max_params parameters on the CPU (a batched matmul over per-worker
    # weights is memory-bound above that), any model on CUDA
    batch: str = "auto"
    batch_max: int = 256  # gradients per batch at most (memory: the bytes of each, reported)
    batch_max_params: int = 200_000
    # false: a cost-only run (docs/design.md, "Cost-only simulation"): the engine's protocol
    # and the clock at the model's real sizes and step times, with no value computed — no
    # gradient, no update's arithmetic, no evaluation; the metrics that need values are
    # absent from the run directory, and summary.json says `numerics: false`
    numerics: bool = True

    def __post_init__(self) -> None:
        if self.batch not in SIM_BATCH:
            raise ConfigError(
                f"sim.batch must be one of {', '.join(SIM_BATCH)}, got {self.batch!r}"
            )
        if self.batch_max < 1:
            raise ConfigError(f"sim.batch_max must be >= 1, got {self.batch_max}")
        if self.batch_max_params < 0:
            raise ConfigError(f"sim.batch_max_params must be >= 0, got {self.batch_max_params}")


@dataclasses.dataclass
class EvalConfig:
    every_updates: int = 0  # snapshot θ every this many server updates (0 = off)
    every_s: float = 1.0  # snapshot θ every this many seconds of training (0 = off)
    train_samples: int = 1000  # training-split samples evaluated per snapshot (0 = none)
    batch_size: int = 1000
    # the split the snapshots are evaluated on: test, or val (`validation_fraction` of the
    # training split held out by a fixed carve, the same for every seed and arm; workers
    # train on the rest and the test split is never evaluated: a tuning run's selection)
    split: str = "test"
    validation_fraction: float = 0.1  # split=val: the share of the training split held out

    def __post_init__(self) -> None:
        for key in ("every_updates", "train_samples"):
            if getattr(self, key) < 0:
                raise ConfigError(f"eval.{key} must be >= 0, got {getattr(self, key)}")
        if self.split not in EVAL_SPLITS:
            raise ConfigError(
                f"eval.split must be one of {', '.join(EVAL_SPLITS)}, got {self.split!r}"
            )
        if not 0.0 < self.validation_fraction <= 0.5:
            raise ConfigError(
                f"eval.validation_fraction must be in (0, 0.5], got {self.validation_fraction}"
            )
        if self.every_s < 0:
            raise ConfigError(f"eval.every_s must be >= 0, got {self.every_s}")
        if self.batch_size < 1:
            raise ConfigError(f"eval.batch_size must be >= 1, got {self.batch_size}")


@dataclasses.dataclass
class LoggerConfig:
    # none: only the run directory; local: the run directory, a live progress line on a
    # terminal and a line per run; wandb: local plus a Weights & Biases run
    name: str = "local"
    project: str = "stalebench"  # W&B project
    # auto: WANDB_MODE from the environment, else offline (no network; `wandb sync` later);
    # offline, online or disabled: that mode, whatever WANDB_MODE says (announced)
    wandb_mode: str = "auto"

    def __post_init__(self) -> None:
        if self.name not in LOGGERS:
            raise ConfigError(f"logger: unknown logger {self.name!r}; known: {', '.join(LOGGERS)}")
        if self.wandb_mode not in WANDB_MODES:
            raise ConfigError(
                f"logger.wandb_mode must be one of {', '.join(WANDB_MODES)}, "
                f"got {self.wandb_mode!r}"
            )


@dataclasses.dataclass
class RunConfig:
    algorithm: AlgorithmConfig = dataclasses.field(default_factory=lambda: algorithm_schema()())
    model: ComponentConfig = MISSING
    dataset: DatasetConfig = MISSING
    cluster: ClusterConfig = MISSING
    logger: LoggerConfig = MISSING
    budget: BudgetConfig = dataclasses.field(default_factory=BudgetConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    # a paper's sweep (set by `+sweep=<paper>`): its name, scale and claims, judged by the report
    sweep: SweepConfig = dataclasses.field(default_factory=SweepConfig)
    # real: one OS process per role over torch.distributed; sim: discrete-event, virtual time
    runtime: str = "real"
    sim: SimConfig = dataclasses.field(default_factory=SimConfig)
    # how the run trains: ps (a server and N workers), allreduce (N replicas), pipeline...
    engine: EngineConfig = MISSING
    device: str = "auto"  # auto | cpu | cuda: where workers compute (transport stays on CPU)
    # where a server (a rank that keeps θ and applies updates but computes no gradient: the
    # parameter server) keeps θ, the update rule's and the optimizer's state: auto as
    # `device` (a GPU of its host where the workers have one), cpu, or cuda
    server_device: str = "auto"
    # the arithmetic of the workers' real compute (`stalebench.precision`): fp32, tf32
    # (CUDA's matmuls and convolutions), bf16 (autocast), fp16 (autocast, each worker's
    # loss scaled as GradScaler scales it). The simulator's modelled step time has its own,
    # cluster.precision
    precision: str = "fp32"
    deterministic: bool = False  # torch's (and cuDNN's) deterministic algorithms
    # torch.compile the model in every process that computes (its forward, and so its
    # backward) with `compile_backend` (torch._dynamo.list_backends()): each compiles its
    # own at its warm-up step, before the run's clock starts. The simulator's batched
    # gradients (sim.batch) run the model through torch.func, eager
    compile: bool = False
    compile_backend: str = "inductor"
    seed: int = 0
    num_threads: int = 1  # intra-op threads per process (N+1 processes share the cores)
    timeout_s: float = 60.0  # longest silence tolerated from any peer before the run fails
    # real runtime: seconds past budget.max_wall_s + 2 * timeout_s (start-up, the stop, the
    # final evaluation) after which the supervisor stops every rank and records `timeout`
    grace_s: float = 120.0
    run_dir: str = ""  # set by the CLI from Hydra's output directory
    # a run_dir that holds a run: refused, unless resume (keep it when it completed with
    # this very config; continue it from its last checkpoint; else run again from the start)
    # or overwrite (replace it)
    resume: bool = False
    overwrite: bool = False
    # resume=true with a checkpoint of this config that cannot be read safely: error (the
    # run is refused, naming the file; nothing changed) or restart (the run's files moved
    # aside to previous/<n>/, and it starts over)
    resume_unreadable: str = "error"
    # run seconds between checkpoints (the server's state, or every rank's at a round's end
    # for the engines without one); 0: none; null: 60 in runtime=real, none in runtime=sim
    checkpoint_every_s: float | None = None
    # the address the real runtime's sockets listen on (the rendezvous store, gloo): the
    # loopback by default, so that no other machine can reach a run's unauthenticated store
    listen_host: str = "127.0.0.1"
    # runtime=real: run even when this machine's cores cannot give every worker the
    # profile's step time (such a run is refused before any process starts, with the
    # numbers); summary.json's `overrun` says how many steps then ran longer than drawn
    oversubscribe: bool = False

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise ConfigError(f"runtime: unknown {self.runtime!r}; known: {', '.join(RUNTIMES)}")
        for key in ("device", "server_device"):
            if getattr(self, key) not in ("auto", "cpu", "cuda"):
                raise ConfigError(f"{key} must be auto, cpu or cuda, got {getattr(self, key)!r}")
        if self.num_threads < 1:
            raise ConfigError(f"num_threads must be >= 1, got {self.num_threads}")
        if self.precision not in ("fp32", "tf32", "bf16", "fp16"):
            raise ConfigError(f"precision must be fp32, tf32, bf16 or fp16, got {self.precision!r}")
        if not self.timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0, got {self.timeout_s}")
        if not self.grace_s > 0:
            raise ConfigError(f"grace_s must be > 0, got {self.grace_s}")
        if self.resume_unreadable not in ("error", "restart"):
            raise ConfigError(
                f"resume_unreadable must be error or restart, got {self.resume_unreadable!r}"
            )
        if self.checkpoint_every_s is not None and not self.checkpoint_every_s >= 0:
            raise ConfigError(f"checkpoint_every_s must be >= 0, got {self.checkpoint_every_s}")
        try:
            ipaddress.ip_address(self.listen_host)
        except ValueError:
            raise ConfigError(
                f"listen_host must be an IP address, got {self.listen_host!r}"
            ) from None
        if self.seed < 0:
            raise ConfigError(f"seed must be >= 0, got {self.seed}")
        check_finite(self)

    @property
    def named_parts(self) -> dict[str, str]:
        """The labels of the algorithm's parts the engine reads, by slot, in its order
        (`slots`): barrier and update rule, schedule and stage optimizer, outer rule and
        inner optimizer, mixing and inner optimizer, or an engine's own."""
        slots = ENGINES.get(self.engine.name)[0].slots
        return {s: getattr(getattr(self.algorithm, s), "label", "?") for s in slots}

    @property
    def parts(self) -> tuple[str, ...]:
        """The labels of `named_parts`, in the engine's order."""
        return tuple(self.named_parts.values())

    @property
    def label(self) -> str:
        """The algorithm as runs are labelled: the preset's name, or its parts."""
        return self.algorithm.name or "+".join(self.parts)


def check_finite(obj: Any, prefix: str = "") -> None:
    """Refuse NaN and ±inf anywhere in a config: no setting means "no limit" by infinity,
    and NaN slips past every comparison (budget.max_wall_s=nan would disable the deadline)."""
    items = (
        ((f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj))
        if dataclasses.is_dataclass(obj)
        else obj.items()
        if isinstance(obj, dict)
        else enumerate(obj)
    )
    for key, value in items:
        name = f"{prefix}[{key}]" if isinstance(key, int) else f"{prefix}.{key}".lstrip(".")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number, got {value}")
        if dataclasses.is_dataclass(value) or isinstance(value, (dict, list, tuple)):
            check_finite(value, name)


def register_configs() -> None:
    """The run's schema and the loggers, in Hydra's ConfigStore (after the plugins are
    loaded, so that the schema has every algorithm part they declare). Stored again only
    when the parts declared changed since the last call, or the store no longer holds the
    nodes it stored (building RunConfig's schema is most of a call's time, and every
    composition calls it)."""
    cs = ConfigStore.instance()
    parts = tuple(PARTS.items())  # all the schema depends on (`algorithm_schema`)
    if _REGISTERED and _REGISTERED[0] == parts:
        held = _registered(cs)
        if all(a is b for a, b in zip(held, _REGISTERED[1], strict=True)):
            return
    cs.store(name="stalebench", node=RunConfig)
    for name in LOGGERS:
        cs.store(group="logger", name=name, node=LoggerConfig(name=name))
    _REGISTERED[:] = [parts, _registered(cs)]


# register_configs' last call: the parts declared then, and the nodes it stored
_REGISTERED: list[tuple] = []


def _registered(cs: ConfigStore) -> tuple:
    """The ConfigStore's nodes register_configs stores (None where absent)."""
    loggers = cs.repo.get("logger")
    return (cs.repo.get("stalebench.yaml"),) + tuple(
        loggers.get(f"{name}.yaml") if isinstance(loggers, dict) else None for name in LOGGERS
    )
