"""engine=pipeline: the model cut into K stages, one rank each (set by the pipeline
presets). `stage` holds the pure parts (a stage's numerics, its op order); `program` is what
a stage's rank does, in both runtimes."""

from __future__ import annotations

from stalebench.algorithms.pipeline import PipelineConfig
from stalebench.engines.base import ENGINES, NETWORK, Engine, EngineConfig
from stalebench.errors import ConfigError
from stalebench.models import MODELS
from stalebench.registry import algorithm_part

# the schedule's settings, a part of the algorithm with no registry of its own (the
# optimizer's registry declares its part)
algorithm_part("pipeline", PipelineConfig)

# cluster settings a pipeline run does not model yet: refused rather than silently ignored
UNMODELLED = (
    "slowdown",
    "slow_fraction",
    "straggler_prob",
    *NETWORK,
    "faults",
    "trace_file",
)


@ENGINES.register("pipeline", EngineConfig)
class PipelineEngine(Engine):
    """The model cut into K stages, one process each; microbatches flow through them."""

    program_modules = ("stalebench.engines.pipeline.program",)

    slots = ("pipeline", "optimizer")
    ignores = UNMODELLED
    one_stream = True  # one stream of microbatches over the whole split
    cost_only = True  # a message's header with values, the activation or gradient without

    @property
    def num_workers(self) -> int:
        return self.run.algorithm.pipeline.stages

    def why_not(self, setting: str) -> str | None:
        if setting == "compile=true":
            return "engine=pipeline's stages run their modules eager (compiling them is not built)"
        return ("engine=pipeline's stages each run a part of backward, so an overflow would "
                "have to be found across them (loss scaling over stages is not built)")  # fmt: skip

    def rank_name(self, rank: int) -> str:
        return f"stage {rank} (rank {rank})"

    def validate(self, splits) -> None:
        super().validate(splits)
        run = self.run
        if run.dataset.sharding == "dirichlet":
            raise ConfigError(
                "dataset.sharding=dirichlet: engine=pipeline feeds one stream of microbatches "
                "over the whole split to its stages; there are no per-worker shards to skew"
            )
        if run.eval.every_updates < 1:
            raise ConfigError(
                f"eval.every_updates={run.eval.every_updates}: engine=pipeline snapshots every "
                "stage at the same step, so it needs eval.every_updates >= 1 (eval.every_s is "
                "not used)"
            )
        if splits.x_train.is_floating_point() or splits.x_train.dim() != 2:
            raise ConfigError(
                f"engine=pipeline trains a language model: dataset={run.dataset.name} gives "
                f"inputs of shape {tuple(splits.x_train.shape[1:])}, not token sequences"
            )
        if len(splits.y_train) < run.dataset.batch_size:
            raise ConfigError(
                f"dataset.batch_size={run.dataset.batch_size} exceeds the "
                f"{len(splits.y_train)} training sequences"
            )
        from stalebench.engines.pipeline.stage import split
        from stalebench.models.nets import Stackable

        model = MODELS.build(run.model, splits.input_shape, splits.num_classes)
        if not isinstance(model, Stackable):
            raise ConfigError(
                f"engine=pipeline cuts a model into [embedding, blocks..., head] stages; "
                f"model={run.model.name} is not built that way (use model=transformer)"
            )
        split(model, run.algorithm.pipeline.stages)

    def role(self, job, world):
        from stalebench.engines.pipeline.program import StageProgram

        return StageProgram(job, world)
