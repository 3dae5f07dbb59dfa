"""`stalebench`: one run, or a Hydra multirun (-m). Bad input is reported as one line
naming the config key and value, before any process starts."""

from __future__ import annotations

import atexit
import contextlib
import difflib
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from stalebench.config import RunConfig, register_configs
from stalebench.errors import BadCheckpoint, ConfigError, RunDirTaken
from stalebench.keys import check_keys
from stalebench.metrics import wandb_mode
from stalebench.metrics.sinks import EventTail, Progress, Sink, Wandb
from stalebench.metrics.summary import EXIT_CODES, write_json
from stalebench.overrides import keeps_preset_name
from stalebench.plugins import load as load_plugins
from stalebench.runtime import signals
from stalebench.runtime.signals import Interrupted, deferred

HELP = """usage: stalebench [KEY=VALUE ...]             one run (defaults: a real 4-worker SSP job)
       stalebench -m [KEY=V1,V2 ...]             a Hydra multirun: one run per combination
       stalebench -m +sweep=NAME [KEY=VALUE ...] a paper sweep (tuned, judged: report.md)
       stalebench list [GROUP]                   what a run can name: engines, models...
       stalebench calibrate [KEY=VALUE ...]      measure this machine: a cluster profile

KEY=VALUE sets a config key (budget.max_wall_s=30) or chooses in a group (algorithm=asp,
model=cnn, cluster=stragglers, runtime=sim); an unknown key or name is refused in one line
with the nearest valid ones, a value of the wrong type with the type expected (exit 2).
Examples:
  stalebench algorithm=asp cluster.num_workers=8 budget.max_wall_s=30
  stalebench runtime=sim algorithm=ssp algorithm.barrier.staleness=3 cluster=stragglers
  stalebench -m algorithm=asp,ssp,bsp seed=0,1,2

Docs: docs/usage.md (every key), docs/algorithms.md, docs/plugins.md. Hydra's own options
(--cfg job, --info, --multirun): stalebench --hydra-help"""

LIST_HELP = """usage: stalebench list [GROUP]

Every component a run can name, with one line each (plugins included): engines, the
algorithm's parts (algorithm/barrier, algorithm/update, ...), algorithm presets, models,
datasets, cluster profiles and sweeps. GROUP shows one of them: stalebench list model
(an algorithm part by its last name too: stalebench list update)"""

CALIBRATE_HELP = """usage: stalebench calibrate [--name NAME] [KEY=VALUE ...]

Measures this machine for the configured model and batch (a step's forward, backward and
optimizer step; gloo's loopback latency and bandwidth; how steps slow when ranks share the
cores; short real probes of the hub and a step's overhead) and writes a cluster profile
NAME (default: calibrated) that a run composes with cluster=NAME (docs/usage.md)."""


def to_run_config(dcfg: DictConfig, overrides: list[str] = ()) -> RunConfig:
    """The validated RunConfig of a composed config (raises ConfigError on bad input)."""
    cfg: RunConfig = OmegaConf.to_object(dcfg)
    if not keeps_preset_name(overrides):
        cfg.algorithm.name = ""  # labelled by its parts
    return cfg


def _start_forkserver(cfg) -> None:
    """A real run's fork server, started before this process imports torch (`experiment`
    does): the server's own import of torch and the run's modules then runs beside this
    one's instead of after it. `experiment.prepare` finds it running."""
    from stalebench import plugins
    from stalebench.config import ENGINES
    from stalebench.runtime import forkserver

    plugins.load()
    forkserver.start(plugins.rank_imports(cfg, ENGINES.build(cfg.engine, cfg)))


@hydra.main(version_base=None, config_path="conf", config_name="config")
def _hydra_main(dcfg: DictConfig) -> float | None:
    hc = HydraConfig.get()
    from stalebench.runtime import nodes

    nodes.from_submitit()  # a task of a SLURM job of several: one rank of the run
    rank = 0 if nodes.owns_run_dir() else 1  # torchrun: is this process the run's rank 0?
    multirun = hc.mode == RunMode.MULTIRUN
    torchrun = nodes.under_torchrun()
    nodes.JOB = str(hc.job.num or 0) if multirun else "0"  # torchrun: the store's prefix
    if deferred():  # a launcher's worker that was signalled (callbacks.StopOnSignal)
        _remove_if_unused(Path(hc.runtime.output_dir))
        sys.exit(Interrupted(deferred()).exit_code)  # it starts no more jobs

    cfg, progress = None, None
    try:
        cfg = to_run_config(dcfg, list(hc.overrides.task))  # a bad value: refused before
        cfg.run_dir = cfg.run_dir or hc.runtime.output_dir  # torch is imported (experiment)
        if nodes.in_submitit() and (Path(cfg.run_dir) / nodes.REQUEUED).exists():
            cfg.resume = True  # a SLURM job requeued after its time limit or a preemption
        if cfg.logger.name != "none" and rank == 0:  # a live line from the start
            progress = Progress(cfg.label, cfg.budget.max_updates, cfg.budget.max_wall_s)
            progress.say("preparing data and model …")
        if cfg.resume and rank == 0 and cfg.resume_unreadable != "restart":
            from stalebench.job import config_sha
            from stalebench.runtime.archive import refuse_early

            refuse_early(Path(cfg.run_dir), config_sha(cfg))  # torch and the data unread
        if cfg.runtime == "real" and rank == 0 and not nodes.under_torchrun():
            _start_forkserver(cfg)
        from stalebench import experiment
        from stalebench.runtime import forkserver

        # torchrun: every process checks the input on its own node, then hears the others'
        engine = experiment.prepare(cfg)
        if torchrun:
            nodes.check_size(engine.world_size(), f"engine={engine.name} with "
                             f"cluster.num_workers={engine.num_workers}")  # fmt: skip
            nodes.agree()
        kept = experiment.claim_run_dir(cfg, keep=not torchrun) if rank == 0 else None
    except ConfigError as exc:
        if progress is not None:
            progress.close(None)  # the error on a line of its own
        print(f"stalebench: error: {exc}", file=sys.stderr)
        if torchrun:  # every other process ends with this line too
            nodes.tell_refusal(str(exc))
            if rank > 0:  # its directory is rank 0's, which decides about it
                if multirun:
                    return None
                nodes.ending_on_refusal()
                sys.exit(EXIT_CODES["invalid"])
        if multirun and rank == 0 and isinstance(exc, BadCheckpoint):
            # the sweep goes on, and its end names this job, whose directory is left as it is
            from stalebench.callbacks import record_refused

            record_refused(Path(hc.sweep.dir), Path(hc.runtime.output_dir), str(exc))
            return None
        if multirun and rank == 0 and not isinstance(exc, RunDirTaken):
            # the sweep goes on; the report lists this job (a job dir that holds a run stops
            # the sweep: it is the whole sweep that is being rerun, without resume=true)
            _record_invalid(Path(hc.runtime.output_dir), exc, cfg)
            return None
        _remove_if_unused(Path(hc.runtime.output_dir))
        if torchrun:
            nodes.ending_on_refusal()
        sys.exit(EXIT_CODES["invalid"])
    if kept:  # resume=true: this job completed with this config before
        if progress is not None:
            progress.close(None)
        print(f"[kept] resume=true: completed before with this config -> {cfg.run_dir}")
        return (kept.get("final") or {}).get("accuracy")
    if torchrun and rank > 0:  # its rank in the run: nodes.form_group
        from stalebench.runtime.launch import run_rank

        try:
            code = run_rank(cfg, engine, rank, int(os.environ["WORLD_SIZE"]), None)
        except ConfigError as exc:  # rank 0 refused its run directory
            print(f"stalebench: error: {exc}", file=sys.stderr)
            code = EXIT_CODES["invalid"]
        if multirun:  # the sweep's next job
            return None
        sys.exit(code)
    tail = _follow(cfg, dcfg, hc, progress)
    summary, interrupted = None, None
    try:
        summary = _run(cfg, engine)
    except Interrupted as exc:
        interrupted = exc
        summary = json.loads((Path(cfg.run_dir) / "summary.json").read_text())
        forkserver.stop()  # this process starts no more runs
    finally:
        tail.close(summary)
    if cfg.logger.name != "none" or interrupted:
        _print_result(summary, cfg.run_dir)
    else:  # logger=none: the run directory holds everything; where it is, in one line
        print(f"[{summary['status']}] -> {cfg.run_dir}")
    if cfg.logger.name == "wandb" and not multirun:  # a sweep's line: at its end (callbacks)
        line = wandb_mode.sync_line(Path(cfg.run_dir))
        if line:
            print(line)
    if interrupted:
        if interrupted.signum == signals.REQUEUE:  # a SLURM task's time limit, preemption
            (Path(cfg.run_dir) / nodes.REQUEUED).touch()  # the requeued job resumes
            signals.requeue(interrupted.signum)  # submitit requeues the job and exits
        sys.exit(interrupted.exit_code)  # a multirun stops here too
    code = EXIT_CODES[summary["status"]]
    if code and not multirun:  # in a multirun the next job runs; the report has them all
        sys.exit(code)
    return (summary.get("final") or {}).get("accuracy")


def _run(cfg: RunConfig, engine) -> dict:
    """Run the job: spawned ranks (or the simulator), or rank 0 of a torchrun launch."""
    from stalebench import experiment
    from stalebench.runtime import nodes

    if not nodes.under_torchrun():
        return experiment.launch(cfg, engine)
    from stalebench.runtime.launch import read_summary, run_rank

    try:  # an interrupt: torchrun's agent stops the other ranks
        with experiment.recording_interrupts(cfg, engine.num_workers):
            code = run_rank(cfg, engine, 0, int(os.environ["WORLD_SIZE"]), None)
        error = None if code == 0 else f"{engine.rank_name(0)} exited with code {code}"
    except Exception as exc:
        error = f"{engine.rank_name(0)}: {exc}"
    # rank 0 may have failed before it wrote summary.json: it is written from the events
    # then, with status failed
    return read_summary(cfg, engine, error)


def _rounded(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def _time(summary: dict) -> str:
    """The run's length on its clock: `simulated_time=` (runtime=sim, virtual seconds) or
    `real_time=` (wall seconds); summary.json's `clock` says which."""
    clock = summary.get("clock")
    return f"{clock + '_' if clock else ''}time={summary['run_time_s']:.1f}s"


def _print_result(summary: dict, run_dir: str) -> None:
    final = summary.get("final") or {}
    split = summary.get("eval_split", "test")  # val: a tuning run (eval.split=val)
    if summary.get("numerics") is False:  # a cost-only run measured no accuracy
        rate = _rounded(summary["throughput_updates_per_s"], 2)
        shown = f"cost-only updates/s={rate} bytes_sent={summary['bytes_sent']}"
    else:
        shown = " ".join(
            f"{split}_{k}={round(final[k], 4)}"
            for k in ("accuracy", "loss", "perplexity")
            if final.get(k) is not None
        )
    print(
        f"[{summary['status']}] {summary['algorithm']} seed={summary['seed']} "
        f"workers={summary['num_workers']} updates={summary['updates']} "
        f"{_time(summary)} {shown or split + '_accuracy=None'} "
        f"mean_lag={_rounded(summary['lag']['mean'], 2)} -> {run_dir}"
        + (f"\n  error: {summary['error']}" if summary["error"] else "")
        + _overrun_line(summary.get("overrun"))
    )


def _overrun_line(overrun: dict | None) -> str:
    """A real run's warning when too many of its steps ran longer than the profile drew, or
    too many of its network waits woke late."""
    if not overrun:
        return ""
    missed = []
    if overrun["fraction"] > overrun["limit"]:
        missed.append(f"{100 * overrun['fraction']:.0f} % of the {overrun['steps']} profiled "
                      "steps ran longer than the profile drew")  # fmt: skip
    if overrun.get("late_fraction", 0.0) > overrun["limit"]:
        missed.append(f"{100 * overrun['late_fraction']:.0f} % of the {overrun['waits']} "
                      "network waits woke late")  # fmt: skip
    if not missed:
        return ""
    return (
        f"\n  warning: {'; '.join(missed)}: this machine was not the cluster asked for "
        "(runtime=sim, fewer workers or a slower profile)"
    )


def _record_invalid(job_dir: Path, exc: ConfigError, cfg: RunConfig | None) -> None:
    """A multirun job refused before it started: summary.json with status `invalid`, the
    error, and its labels (the algorithm's as the run would give it when its config could be
    read, the rest as Hydra's config.yaml gives them), so that the report lists it."""
    from stalebench.report.collect import hydra_labels

    labels = hydra_labels(job_dir)
    if cfg is not None:
        with contextlib.suppress(ConfigError):  # an engine no registry knows: no slots
            labels["algorithm"] = cfg.label
    job_dir.mkdir(parents=True, exist_ok=True)
    write_json(
        job_dir / "summary.json", {"status": "invalid", "error": str(exc), **labels, "updates": 0}
    )


def _follow(cfg: RunConfig, dcfg: DictConfig, hc, progress: Progress | None) -> EventTail:
    """The sinks that follow this run's events: progress line, W&B (never in a worker)."""
    sinks: list[Sink] = [progress] if progress is not None and progress.enabled else []
    if cfg.logger.name == "wandb":
        multirun = hc.mode == RunMode.MULTIRUN
        mode = _wandb_mode(cfg, hc, multirun)
        try:
            sink = Wandb(
                project=cfg.logger.project,
                mode=mode,
                run_dir=Path(cfg.run_dir),
                name=f"{cfg.label}-seed{cfg.seed}-{Path(cfg.run_dir).name}",
                group=(cfg.sweep.name or "/".join(Path(hc.sweep.dir).parts[-2:]))
                if multirun
                else None,
                job_type=cfg.label,
                config=OmegaConf.to_container(dcfg, resolve=True),
            )
        except Exception as exc:  # W&B never fails the run: events.jsonl has everything
            print(f"stalebench: warning: W&B not started: {exc}", file=sys.stderr)
        else:
            sinks.append(sink)
            if sink.fallback:  # an online start failed: offline, and so the rest of a sweep
                wandb_mode.record_online(Path(hc.sweep.dir) if multirun else None, sink.fallback)
                print(f"stalebench: warning: W&B did not start online ({sink.fallback}); it "
                      "logs offline" + (", and so does the rest of the sweep" if multirun else ""),
                      file=sys.stderr)  # fmt: skip
    tail = EventTail(Path(cfg.run_dir) / "events.jsonl", sinks)
    tail.start()
    return tail


def _wandb_mode(cfg: RunConfig, hc, multirun: bool) -> str:
    """The W&B mode of this run (`wandb_mode.resolve`), each line about it said once per
    sweep; online only if the W&B host answers (checked once per sweep)."""
    first = not multirun or hc.job.num == 0
    mode, note = wandb_mode.resolve(cfg.logger.wandb_mode)
    if note and first:
        print(f"stalebench: {note}", file=sys.stderr)
    mode, why, mine = wandb_mode.online(mode, Path(hc.sweep.dir) if multirun else None)
    if why and mine:
        print(f"stalebench: warning: W&B online logging is off: {why}; it logs offline"
              + (", for the whole sweep" if multirun else ""), file=sys.stderr)  # fmt: skip
    return mode


def groups() -> set[str]:
    """The config groups a name is chosen in: every registry's (an algorithm part's, a
    plugin's included) and the YAML ones."""
    from stalebench.registry import REGISTRIES

    return {"algorithm", "cluster", "logger", "sweep", *REGISTRIES}


def options(group: str) -> set[str]:
    """Names selectable in a config group: registered schemas and YAML presets."""
    from hydra.core.config_store import ConfigStore

    from stalebench.plugins import yaml_files

    stored = ConfigStore.instance().list(group) if group in _store_groups() else []
    names = {n.removesuffix(".yaml") for n in stored if n.endswith(".yaml")}
    return names | {f.name.removesuffix(".yaml") for f in yaml_files(group)}  # plugins' too


def _store_groups() -> set[str]:
    from hydra.core.config_store import ConfigStore

    groups, stack = set(), [("", ConfigStore.instance().repo)]
    while stack:
        prefix, node = stack.pop()
        for key, value in node.items():
            if isinstance(value, dict):
                groups.add(prefix + key)
                stack.append((prefix + key + "/", value))
    return groups


def check_choices(argv: list[str]) -> None:
    """Unknown names in group overrides (`algorithm=foo`, also inside -m sweeps), as one line
    each, before Hydra composes anything."""
    for arg in argv:
        group, sep, value = arg.lstrip("+~").partition("=")
        if not sep or group not in groups() or value.startswith(("glob(", "choice(", "range(")):
            continue
        known = options(group)
        for name in (v.strip().strip("'\"") for v in value.split(",")):
            if name and name not in known:
                close = difflib.get_close_matches(name, sorted(known), n=2, cutoff=0.6)
                hint = f"did you mean {' or '.join(close)}? " if close else ""
                raise ConfigError(
                    f"{group}: unknown {name!r}; {hint}known: {', '.join(sorted(known))}"
                )


def compose_run(overrides: list[str]) -> RunConfig:
    """The validated RunConfig of CLI-style overrides, composed without running a job (a
    command that only reads the config: calibrate)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    load_plugins()
    register_configs()
    check_choices(overrides)  # one line naming the key or name, as on the command line
    check_keys(overrides, groups())
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module("stalebench.conf", version_base=None):
            return to_run_config(compose("config", overrides=overrides), overrides)
    finally:
        GlobalHydra.instance().clear()


START_BYTES = 64 << 10  # what a run writes before it holds room: Hydra's .hydra/ (~6 kB)
# Hydra's options that write no run directory
NO_RUN_DIR = {"--cfg", "-c", "--info", "-i", "--hydra-help", "--shell-completion", "-sc"}


def check_room(argv: list[str]) -> None:
    """Refuse a run (a sweep) whose directory cannot be written at all — a disk already
    full, a file-size limit, a folder not writable — in one line naming it, before Hydra
    writes its config files there (it would fail with a traceback). The nearest folder that
    exists is probed: its free space, and a small file written and removed unseen."""
    if NO_RUN_DIR & set(argv):
        return
    key = "hydra.sweep.dir" if {"-m", "--multirun"} & set(argv) else "hydra.run.dir"
    given = [a.partition("=")[2] for a in argv if a.partition("=")[0].lstrip("+") == key]
    value = given[-1] if given else _default_dir(key)
    base = Path(value.partition("${")[0] or ".").absolute()
    while not base.is_dir() and base != base.parent:
        base = base.parent
    try:
        disk = os.statvfs(base)
        free = disk.f_bavail * disk.f_frsize
        if free < START_BYTES:
            raise ConfigError(
                f"{key}={value}: the disk is full ({base} has {free >> 10} kB free; a run "
                f"needs {START_BYTES >> 10} kB to start)"
            )
        with tempfile.TemporaryFile(dir=base) as probe:
            probe.write(bytes(4096))
            probe.flush()
    except OSError as exc:
        raise ConfigError(f"{key}={value}: cannot write in {base}: {exc.strerror}") from None


def _default_dir(key: str) -> str:
    """The run (or sweep) directory conf/config.yaml gives, uninterpolated."""
    import yaml

    conf = yaml.safe_load((Path(__file__).parent / "conf" / "config.yaml").read_text())
    section = conf["hydra"]["sweep" if key == "hydra.sweep.dir" else "run"]
    return section["dir"]


def _remove_if_unused(run_dir: Path) -> None:
    """A run rejected before it started leaves no directory that looks like a run."""
    if run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= {".hydra", "cli.log"}:
        shutil.rmtree(run_dir, ignore_errors=True)


def main() -> None:
    # a log file on a full disk: its handler says nothing (no traceback per line); the run
    # ends failed, its summary.json naming the file it could not write
    logging.raiseExceptions = False
    load_plugins()
    register_configs()
    args = sys.argv[1:]
    if args[:1] in (["-h"], ["--help"]):
        print(HELP)
        return
    if args[:1] == ["list"]:
        from stalebench.catalog import render

        if set(args[1:]) & {"-h", "--help"}:
            print(LIST_HELP)
            return
        try:
            if len(args) > 2:
                raise ConfigError(f"list takes at most one group, got {' '.join(args[1:])}")
            print(render(args[1] if len(args) == 2 else None))
        except ConfigError as exc:
            print(f"stalebench: error: {exc}", file=sys.stderr)
            sys.exit(2)
        return
    if sys.argv[1:2] == ["calibrate"]:
        from stalebench import calibrate

        if set(sys.argv[2:]) & {"-h", "--help"}:
            print(CALIBRATE_HELP)
            return
        argv, name = sys.argv[2:], calibrate.NAME
        if "--name" in argv:
            i = argv.index("--name")
            name, argv = argv[i + 1], argv[:i] + argv[i + 2 :]
        try:
            path = calibrate.run(compose_run(argv), name)
            print(path.read_text() + f"wrote {path}: run with cluster={name}")
        except ConfigError as exc:
            print(f"stalebench: error: {exc}", file=sys.stderr)
            sys.exit(2)
        return
    from stalebench.runtime.nodes import (
        ending_on_refusal,
        owns_run_dir,
        tell_refusal,
        under_torchrun,
    )

    try:
        check_choices(sys.argv[1:])
        check_keys(sys.argv[1:], groups())
        if owns_run_dir():
            check_room(sys.argv[1:])
    except ConfigError as exc:
        print(f"stalebench: error: {exc}", file=sys.stderr)
        if under_torchrun():  # every other process ends with this line too
            tell_refusal(str(exc))
            ending_on_refusal()
        sys.exit(2)
    if not owns_run_dir():
        # torchrun rank > 0: rank 0 owns the run directory (it sends its path to the others);
        # Hydra must not make a directory of its own, which ${now:} would name per process,
        # nor, under -m, a sweep's directories, files or report (rank 0's sweep has them):
        # what its sweeper writes goes to a directory of its own, removed at its exit
        scratch = tempfile.mkdtemp(prefix="stalebench-sweep-")
        atexit.register(shutil.rmtree, scratch, ignore_errors=True)
        sys.argv += [
            "hydra.output_subdir=null",
            "hydra.run.dir=.",
            f"hydra.sweep.dir={scratch}",
            "hydra.sweep.subdir=.",
            "~hydra.callbacks.report",
            "hydra/job_logging=none",
            "hydra/hydra_logging=none",
        ]
    try:
        _hydra_main()
    except Interrupted as exc:  # a multirun's top process: its jobs stopped (StopOnSignal)
        print(f"stalebench: multirun {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    from stalebench.callbacks import SWEEP_STATUSES

    if any(status not in ("completed", "diverged") for status in SWEEP_STATUSES):
        sys.exit(EXIT_CODES["failed"])  # a sweep with a job that measured nothing


def script() -> NoReturn:
    """The `stalebench` command (and `python -m stalebench.cli`): `main`, then the end of
    the process as the interpreter ends it (its threads joined, its exit handlers run:
    logging's, W&B's, multiprocessing's; what the event logs and the standard streams still
    hold written out) without the interpreter's teardown of every module, one by one: about
    a second once torch is loaded, in which nothing is written. An exception other than
    SystemExit (a traceback, an interrupt) ends the process the interpreter's own way."""
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code
    if code is not None and not isinstance(code, int):  # sys.exit("...") prints it: exit 1
        print(code, file=sys.stderr)
        code = 1
    end(code or 0)


def end(code: int) -> NoReturn:
    """The process's end with `code`, as the interpreter's exit (`script`) less its teardown
    of every module."""
    import threading

    from stalebench.metrics.events import EventLog

    threading._shutdown()  # what the interpreter does first at its exit: the atexit hooks
    # of threading (concurrent.futures' workers told to stop), then every thread joined
    atexit._run_exitfuncs()
    with contextlib.suppress(OSError):
        EventLog.flush_all()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`| head`)
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    script()
