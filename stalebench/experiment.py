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
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stalebench import plugins
from stalebench.cluster import Profile, check_regions
from stalebench.config import ENGINES, RunConfig
from stalebench.data import DATASETS
from stalebench.engines.base import Engine
from stalebench.errors import (
    BadCheckpoint,
    ConfigError,
    RunDirTaken,
    last_line,
    with_traceback,
)
from stalebench.evaluation import SPILL
from stalebench.job import Job, build_model, config_sha, load_splits, meta, numerics, step_time
from stalebench.metrics.summary import stop
from stalebench.models import MODELS
from stalebench.runtime import checkpoint, compute, forkserver, nodes
from stalebench.runtime.signals import Interrupted, interrupt_if_deferred, interruptible

log = logging.getLogger("stalebench")


def engine_of(cfg: RunConfig) -> Engine:
    """The engine `cfg.engine` names, built for this run."""
    plugins.load()
    return ENGINES.build(cfg.engine, cfg)


def check_device(cfg: RunConfig) -> None:
    """device=cuda or server_device=cuda is refused where torch sees no GPU."""
    import torch

    for key in ("device", "server_device"):
        if getattr(cfg, key) == "cuda" and numerics(cfg) and not torch.cuda.is_available():
            raise ConfigError(f"{key}=cuda but CUDA is not available here (use {key}=auto)")


def check_compile(cfg: RunConfig) -> None:
    """compile=true with a backend torch.compile does not know is refused by name."""
    if not cfg.compile or not numerics(cfg):
        return
    import torch._dynamo

    known = torch._dynamo.list_backends(exclude_tags=())
    if cfg.compile_backend not in known:
        raise ConfigError(
            f"compile_backend: torch.compile knows no backend {cfg.compile_backend!r} "
            f"(it knows {', '.join(known)})"
        )


def say_device(cfg: RunConfig) -> None:
    """device=auto where torch sees no GPU, or real processes on GPUs whose steps the profile
    pads to an emulated time: one line on stderr, as the run starts (stdout's lines are the
    run's; a refusal before it is the only line)."""
    import torch

    gpu = torch.cuda.is_available()
    if cfg.device == "auto" and numerics(cfg) and not gpu:
        print("stalebench: device=auto: no CUDA device here, every rank computes on the CPU",
              file=sys.stderr)  # fmt: skip
    elif gpu and cfg.device != "cpu" and step_time(cfg) == "emulated":
        print(f"stalebench: the workers compute on GPUs, each step padded to cluster="
              f"{cfg.cluster.preset}'s emulated {cfg.cluster.compute_ms:g} ms "
              "(cluster.compute_ms=0: as long as the GPU takes)", file=sys.stderr)  # fmt: skip


def prepare(cfg: RunConfig) -> Engine:
    """Everything that can be wrong with the input, checked before any process starts;
    returns the run's engine."""
    engine = engine_of(cfg)
    imports = plugins.rank_imports(cfg, engine)  # a part set to a name no registry knows
    MODELS.get(cfg.model.name)
    Profile(cfg.cluster, cfg.seed)  # a trace file is read (and refused) here, not per process
    if cfg.runtime == "real" and not nodes.under_torchrun():
        # its imports overlap the checks below (the data, the model); the engine's programs
        # too (registering it imports none of them), so no rank imports them after its fork
        forkserver.start(imports)  # running already where the CLI started it
    dataset = DATASETS.build(cfg.dataset)
    dataset.prepare()
    splits = load_splits(cfg, dataset)  # eval.split=val: what workers shard is smaller
    splits.check(f"dataset={cfg.dataset.name}")
    if splits.x_train.is_meta and numerics(cfg):
        raise ConfigError(
            f"dataset={cfg.dataset.name} holds shapes without values: it runs only cost-only "
            "(runtime=sim sim.numerics=false)"
        )
    if cfg.cluster.device:
        derive_compute(cfg, splits)
    engine.validate(splits)
    check_regions(cfg.cluster, engine.world_size())
    # a model that cannot take the dataset's inputs fails here, not inside every process
    model = build_model(cfg, splits)
    check_pair(cfg, model, splits)
    check_device(cfg)
    check_compile(cfg)
    if cfg.runtime == "real":
        check_processes(cfg, engine.world_size())
        if not nodes.under_torchrun():  # torchrun's ranks are on other machines' cores
            check_cores(cfg, engine.num_workers, model, splits, engine.one_stream)
    engine.load_programs()  # before any checkpoint is read (resume=true)
    return engine


def derive_compute(cfg: RunConfig, splits) -> None:
    """cluster.device: the step's mean time from the run's model, its FLOPs per minibatch
    at the device's peak × utilization (`runtime.compute`), replaces cluster.compute_ms
    (a preset's or one given: the device is the source asked for; the log says both)."""
    from stalebench.cluster import DEVICES

    c = cfg.cluster
    x, y = compute.minibatch(cfg, splits)
    model = build_model(cfg, splits)
    flops = compute.step_flops(model, x, y)
    ms = compute.step_ms(flops, c.device, c.precision, c.utilization)
    if c.utilization_curve:  # a measured curve: a small minibatch runs below the peak's share
        from stalebench.cluster import relative_utilization

        share = relative_utilization(c.utilization_curve, len(y))
        log.info(
            "cluster.utilization_curve=%s: a minibatch of %d at %.3g of the best throughput",
            c.utilization_curve, len(y), share,
        )  # fmt: skip
        ms /= share
    log.info(
        "cluster.device=%s: %.4g GFLOPs a step (model=%s, batch %d) at %g %% of %g TFLOP/s "
        "(%s): cluster.compute_ms=%.4g (was %g)", c.device, flops / 1e9, cfg.model.name, len(y),
        100 * c.utilization, DEVICES[c.device].tflops[c.precision], c.precision, ms,
        c.compute_ms,
    )  # fmt: skip
    c.compute_ms = ms


def check_pair(cfg: RunConfig, model, splits) -> None:
    """A training step's forward and backward on two training examples, as a worker takes
    it: a model that cannot take the dataset's inputs or targets (token ids for a float
    model, features for a language model) is refused here, by name, not inside every rank."""
    import torch

    from stalebench.evaluation import objective

    x, y = splits.x_train[:2], splits.y_train[:2]
    if splits.augment is not None and not x.is_meta:
        x = splits.augment(x, torch.Generator().manual_seed(0))
    device = next(model.parameters()).device  # meta in a cost-only run: shapes only
    try:
        x, y = x.to(device), y.to(device)
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
    """Refuse a process count this machine cannot hold in memory, before starting any
    (under torchrun, this node's: `LOCAL_WORLD_SIZE`)."""
    if nodes.under_torchrun():
        world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    need_mb, have_mb = world * RANK_MB, _available_mb()
    if have_mb is not None and need_mb > have_mb:
        raise ConfigError(
            f"cluster.num_workers={cfg.cluster.num_workers} needs {world} processes here "
            f"(engine={cfg.engine.name}), about {need_mb} MB, but {have_mb} MB is available "
            "(runtime=sim runs any number of workers in one process)"
        )


def step_cpu_s(cfg: RunConfig, model, splits, repeats: int = 9) -> float:
    """One training step's CPU time on this machine: the model's forward and backward on a
    minibatch of dataset.batch_size, with the run's threads per process (the least of
    `repeats`, after one to warm up). CPU time, not wall time: what the step needs of a
    core; the least, since whatever else runs on the machine meanwhile only adds to it
    (caches, the other hyperthread: 0.44 ms median, 0.37 least, 0.77 with both cores
    loaded, for the tests' MLP here)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.num_threads)
    try:
        x, y = compute.minibatch(cfg, splits)
        return compute.time_step(model, x, y, repeats, clock=time.process_time, stat=min)
    finally:
        torch.set_num_threads(threads)


# CPU a real step costs beyond its gradient: the worker's receive and send, the server's
# update, the processes' switching. Measured on a 2-core machine: 2 real ASP workers with no
# emulation (CNN, batch 32) made 628 updates/s, 3.2 ms of CPU per update, of which the
# forward and backward (`step_cpu_s`) are ~1.1 ms
STEP_OVERHEAD_S = 0.002


def check_cores(
    cfg: RunConfig, workers: int, model, splits, split: bool = False, step_s: float | None = None
) -> None:
    """Refuse a real run whose workers, as measured here, need more of this machine's
    cores than the profile's step times leave: each worker spends a step's forward and
    backward (`step_cpu_s`) plus `STEP_OVERHEAD_S` of CPU every `compute_ms` × its
    slowdown (`split`: the workers compute one step of the model together, a pipeline's
    stages, each its share); beyond the cores the processes wait for one another and every
    step runs longer than the profile draws, silently. A profile of real compute only
    (compute_ms 0) asks for no step time and is not checked."""
    c = cfg.cluster
    if c.compute_ms <= 0 or cfg.oversubscribe:
        return
    have = compute.cores()
    if workers * cfg.num_threads <= have:
        return  # every worker a core of its own: no step can wait for a core
    if step_s is None:
        import torch

        if cfg.device != "cpu" and torch.cuda.is_available():
            return  # the workers compute on the GPU, not on these cores
        step_s = step_cpu_s(cfg, model, splits) / (workers if split else 1) + STEP_OVERHEAD_S
    slowdown = Profile(c, cfg.seed).slowdown[:workers]
    need = sum(step_s * cfg.num_threads / (c.compute_ms / 1000 * m) for m in slowdown)
    if need <= have:
        return
    fits = int(have * c.compute_ms / 1000 / (step_s * cfg.num_threads))
    fewer = f"at most about {fits} workers, " if fits >= 1 else ""
    slower = need / have * c.compute_ms
    raise ConfigError(
        f"cluster.num_workers={c.num_workers}: runtime=real on this machine's {have} cores "
        f"cannot keep cluster.compute_ms={c.compute_ms:g}: a step of model={cfg.model.name} "
        f"at dataset.batch_size={cfg.dataset.batch_size} costs {1000 * step_s:.2f} ms of CPU "
        f"here with its messages, so the {workers} workers need {need:.1f} cores to step at "
        f"the profile's pace; steps would run longer than the profile draws. Use "
        f"runtime=sim (any number of workers), {fewer}a slower profile "
        f"(cluster.compute_ms >= {slower:.0f}), or oversubscribe=true to run it "
        "anyway (summary.json's `overrun` then counts the steps that ran long)"
    )


def _available_mb() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


PREVIOUS = "previous"  # where resume=true moves a run it does not go on from
RUN_FILES = ("events.jsonl", "summary.json", "metrics.parquet", "model.pt", "logs", "checkpoint",
             "events-after-end.jsonl", SPILL)  # fmt: skip


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
        raise BadCheckpoint(str(exc)) from None
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
    say_device(cfg)
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
    with interruptible(requeue=nodes.in_submitit()):  # a SLURM task: its time limit too
        try:
            interrupt_if_deferred()  # a launcher's worker signalled before this run began
            yield
        except Interrupted as exc:
            target = cfg.budget.target_accuracy
            stop(Path(cfg.run_dir), meta(cfg, num_workers), "interrupted", str(exc), target)
            raise
