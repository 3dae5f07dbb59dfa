"""compose → validate → build components → run in a runtime → summary.

Everything a process needs to take part in a run is rebuilt from the RunConfig, so every
process (spawned, or started by torchrun) agrees on model, data and algorithm without
shipping objects between processes. The engine chosen by `engine=<name>` says what each
process does; this module only asks it through its hooks.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stalebench import plugins
from stalebench.cluster import Profile
from stalebench.config import ENGINES, RunConfig
from stalebench.data import DATASETS
from stalebench.engines.base import Engine
from stalebench.errors import ConfigError, last_line, with_traceback
from stalebench.job import Job, config_sha, load_splits, meta
from stalebench.metrics.summary import stop
from stalebench.models import MODELS
from stalebench.registry import PARTS, REGISTRIES
from stalebench.runtime import checkpoint, forkserver, nodes
from stalebench.runtime.signals import Interrupted, interrupt_if_deferred, interruptible

log = logging.getLogger("stalebench")


def engine_of(cfg: RunConfig) -> Engine:
    """The engine `cfg.engine` names, built for this run."""
    plugins.load()
    return ENGINES.build(cfg.engine, cfg)


def check_device(cfg: RunConfig) -> None:
    if cfg.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("device=cuda but CUDA is not available here (use device=auto)")


def prepare(cfg: RunConfig) -> Engine:
    """Everything that can be wrong with the input, checked before any process starts;
    returns the run's engine."""
    engine = engine_of(cfg)
    for slot in PARTS:  # a part set to a name no registry knows
        part, registry = getattr(cfg.algorithm, slot), REGISTRIES.get(f"algorithm/{slot}")
        if part is not None and registry is not None:
            registry.get(part.name)
    MODELS.get(cfg.model.name)
    Profile(cfg.cluster, cfg.seed)  # a trace file is read (and refused) here, not per process
    if cfg.runtime == "real" and not nodes.under_torchrun():
        # its imports overlap the checks below (the data, the model)
        forkserver.start([type(engine).__module__])
    dataset = DATASETS.build(cfg.dataset)
    dataset.prepare()
    splits = load_splits(cfg, dataset)  # eval.split=val: what workers shard is smaller
    splits.check(f"dataset={cfg.dataset.name}")
    engine.validate(splits)
    # a model that cannot take the dataset's inputs fails here, not inside every process
    check_pair(cfg, MODELS.build(cfg.model, splits.input_shape, splits.num_classes), splits)
    check_device(cfg)
    if cfg.runtime == "real":
        check_processes(cfg, engine.world_size())
    return engine


def check_pair(cfg: RunConfig, model, splits) -> None:
    """A training step's forward and backward on two training examples, as a worker takes
    it: a model that cannot take the dataset's inputs or targets (token ids for a float
    model, features for a language model) is refused here, by name, not inside every rank."""
    import torch

    from stalebench.evaluation import objective

    x, y = splits.x_train[:2], splits.y_train[:2]
    if splits.augment is not None:
        x = splits.augment(x, torch.Generator().manual_seed(0))
    try:
        objective(model(x), y).backward()
    except Exception as exc:  # whatever torch says of the pair, as the reason
        reason = last_line(exc)
        raise ConfigError(
            f"model={cfg.model.name} cannot train on dataset={cfg.dataset.name} (inputs "
            f"{str(x.dtype).removeprefix('torch.')} of shape {tuple(x.shape[1:])}, targets "
            f"{str(y.dtype).removeprefix('torch.')}): {reason}"
        ) from None


RANK_MB = 256  # what one rank holds at least: the interpreter, torch, the data (measured)


def check_processes(cfg: RunConfig, world: int) -> None:
    """Refuse a process count this machine cannot hold in memory, before starting any."""
    need_mb, have_mb = world * RANK_MB, _available_mb()
    if have_mb is not None and need_mb > have_mb:
        raise ConfigError(
            f"cluster.num_workers={cfg.cluster.num_workers} needs {world} processes here "
            f"(engine={cfg.engine.name}), about {need_mb} MB, but {have_mb} MB is available "
            "(runtime=sim runs any number of workers in one process)"
        )


def _available_mb() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


class RunDirTaken(ConfigError):
    """run_dir holds a run and neither resume nor overwrite was asked for."""


class BadCheckpoint(RunDirTaken):
    """resume=true, and the run's checkpoint of this config holds a file that cannot be read
    safely: the run is not started, and nothing of its directory is changed."""


PREVIOUS = "previous"  # where resume=true moves a run it does not go on from
RUN_FILES = ("events.jsonl", "summary.json", "metrics.parquet", "model.pt", "logs", "checkpoint")


def claim_run_dir(cfg: RunConfig, keep: bool = True) -> dict[str, Any] | None:
    """Make `cfg.run_dir` ready for this run. A directory that holds a run is refused
    unless `resume` (returns that run's summary when it completed with this very config:
    nothing to do; keeps it when it holds a checkpoint of this config, which the run goes
    on from; otherwise runs again, the earlier run's files moved aside to `previous/<n>/`)
    or `overwrite` (clears it). Nothing is deleted but what overwrite=true asks for and
    what a resumed run computes again. `keep` False: never keep a completed one (the other
    ranks of a torchrun launch are already waiting)."""
    run_dir = Path(cfg.run_dir)
    held = [n for n in RUN_FILES if (run_dir / n).exists()]
    if not held:
        return None
    previous = _summary(run_dir / "summary.json")
    if keep and cfg.resume and previous and previous.get("status") == "completed":
        if previous.get("config_sha") == config_sha(cfg):
            return previous
    elif not (cfg.resume or cfg.overwrite):
        status = previous.get("status") if previous else "no summary.json"
        raise RunDirTaken(
            f"run_dir={run_dir} already holds a run ({status}); set resume=true to keep it "
            "if it completed with this config (else continue or run again), or overwrite=true "
            "to replace it"
        )
    saved = _checkpoint(run_dir, cfg) if cfg.resume else None
    if saved:  # go on from it: the files of the run's end are written again
        checkpoint.rewind(run_dir, saved)
        for name in ("summary.json", "metrics.parquet", "model.pt"):
            (run_dir / name).unlink(missing_ok=True)
    elif cfg.overwrite:
        for name in held:
            path = run_dir / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    else:
        aside = move_aside(run_dir, held)
        log.warning("resume=true: running again from the start; the run it held is in %s", aside)
    return None


def move_aside(run_dir: Path, names: list[str]) -> Path:
    """Move the files `names` of run_dir into a new `previous/<n>/` (n = 1, 2, ...), where
    the report does not look (a run directory holds no other runs); returns it."""
    folder = run_dir / PREVIOUS
    n = 1 + max((int(p.name) for p in folder.glob("*") if p.name.isdigit()), default=0)
    (folder / str(n)).mkdir(parents=True)
    for name in names:
        os.replace(run_dir / name, folder / str(n) / name)
    return folder / str(n)


def _checkpoint(run_dir: Path, cfg: RunConfig) -> dict[str, Any] | None:
    """The checkpoint in run_dir of a run of this very config, if there is one, with every
    file it goes on from read safely first. One that cannot be is refused by name
    (`BadCheckpoint`) before anything of the run directory is changed, or with
    resume_unreadable=restart, the run starts over (its files moved aside)."""
    try:
        saved = checkpoint.load(run_dir, config_sha(cfg))
        if saved is not None:
            checkpoint.verify(run_dir, saved)
    except checkpoint.Unreadable as exc:
        if cfg.resume_unreadable == "restart":
            log.warning("resume=true: %s; resume_unreadable=restart: starting over", exc)
            return None
        raise BadCheckpoint(
            f"resume=true: {exc}. Nothing of the run directory was changed: set "
            "resume_unreadable=restart to start over (the run's files moved aside to "
            f"{PREVIOUS}/), or remove the checkpoint"
        ) from None
    return saved


def _summary(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run(cfg: RunConfig) -> dict[str, Any]:
    """Run one configured job to its end and return its summary (also in summary.json);
    with `resume`, a job that already completed with this config is not run again."""
    engine = prepare(cfg)
    return claim_run_dir(cfg) or launch(cfg, engine)


def launch(cfg: RunConfig, engine: Engine | None = None) -> dict[str, Any]:
    """Run a prepared job in its runtime."""
    engine = engine or engine_of(cfg)
    if not cfg.run_dir:
        raise ConfigError("run_dir is empty: the CLI sets it from Hydra's output directory")
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    with recording_interrupts(cfg, engine.num_workers):
        if cfg.runtime == "sim":
            from stalebench.runtime import sim

            try:
                job = Job.build(cfg, engine.num_workers, engine.one_stream)
                return sim.simulate(engine.program, job, Path(cfg.run_dir), engine.world_size())
            except Exception as exc:  # as a rank's error ends a real run: failed, and why
                log.error("simulator: %s", exc, exc_info=with_traceback(exc))
                reason = f"simulator: {last_line(exc)}"
                target = cfg.budget.target_accuracy
                return stop(
                    Path(cfg.run_dir), meta(cfg, engine.num_workers), "failed", reason, target
                )
        from stalebench.runtime import launch as real

        return real.launch(cfg, engine, plugins.load)


@contextlib.contextmanager
def recording_interrupts(cfg: RunConfig, num_workers: int) -> Iterator[None]:
    """SIGINT or SIGTERM inside ends the run `interrupted`: whatever the block does on its
    way out runs first (the real runtime stops its ranks), then the stop event and
    summary.json are written, with further signals ignored, and `Interrupted` goes on."""
    with interruptible():
        try:
            interrupt_if_deferred()  # a launcher's worker signalled before this run began
            yield
        except Interrupted as exc:
            target = cfg.budget.target_accuracy
            stop(Path(cfg.run_dir), meta(cfg, num_workers), "interrupted", str(exc), target)
            raise
