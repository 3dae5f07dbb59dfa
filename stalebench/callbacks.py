"""Hydra callbacks: a signal to a multirun stops its jobs cleanly; at the end of a
multirun, write the sweep's report and name the jobs that were refused without a trace in
their own directories (a checkpoint resume=true could not read)."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from stalebench.metrics import wandb_mode
from stalebench.runtime import signals
from stalebench.runtime.signals import SIGNALS, Interrupted

log = logging.getLogger("stalebench")

# how long a multirun's jobs in other processes have to end once signalled (an interrupted
# run stops its ranks within 5 s and writes its summary) before their processes are killed
STOP_S = 15.0

# statuses of the last multirun's jobs (the CLI's exit code of a sweep), set at its end
SWEEP_STATUSES: list[str] = []

# in a sweep directory, a file per job refused whose directory was left as it was (a bad
# checkpoint: `record_refused`), written by the job's process (a launcher's worker, maybe)
REFUSED = ".refused"


def record_refused(sweep_dir: Path, job_dir: Path, error: str) -> None:
    """Keep, for the sweep's end, that the job in `job_dir` was refused and why."""
    folder = sweep_dir / REFUSED
    try:
        folder.mkdir(parents=True, exist_ok=True)
        name = str(job_dir.absolute().relative_to(sweep_dir.absolute())).replace(os.sep, "_")
        (folder / f"{name}.json").write_text(json.dumps({"job": str(job_dir), "error": error}))
    except (OSError, ValueError) as exc:  # the job's own line said it already
        log.warning("the refusal of %s not kept for the sweep's end: %s", job_dir, exc)


def refused(sweep_dir: Path) -> list[dict[str, str]]:
    """The jobs of this sweep refused (`record_refused`), in job order."""
    found = []
    for path in sorted((sweep_dir / REFUSED).glob("*.json")):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(found, key=lambda r: [int(p) if p.isdigit() else p for p in Path(r["job"]).parts])


class ReportOnSweepEnd(Callback):
    """Runs `stalebench-report` on the sweep directory and, with logger=wandb, logs a paper
    sweep's claim verdicts to W&B; a failure is logged, never raised (the runs themselves
    are already on disk). Then names, one line each, the jobs refused whose directories say
    nothing of it (`record_refused`): they count as `invalid` in the sweep's exit code."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # a sweep rerun into its directory: the refusals of an earlier run are not this one's
        shutil.rmtree(Path(config.hydra.sweep.dir) / REFUSED, ignore_errors=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        jobs = refused(sweep_dir)
        SWEEP_STATUSES[:] = _statuses(sweep_dir) + ["invalid"] * len(jobs)
        try:
            self._report(config, sweep_dir)
        finally:
            for job in jobs:
                print(f"stalebench: error: {job['job']}: not run: {job['error']}", file=sys.stderr)

    def _report(self, config: DictConfig, sweep_dir: Path) -> None:
        try:
            from stalebench.report.cli import main

            main([str(sweep_dir)])
        except Exception as exc:
            log.warning("stalebench-report failed on %s: %s", sweep_dir, exc)
            return
        claims = sweep_dir / "claims.json"
        logger = config.get("logger") or {}
        if logger.get("name") != "wandb":
            return
        try:  # W&B never fails the sweep: claims.json has the verdicts
            if claims.is_file():
                from stalebench.metrics.sinks import log_verdicts

                log_verdicts(
                    json.loads(claims.read_text())["claims"],
                    project=logger.get("project", "stalebench"),
                    mode=wandb_mode.online(
                        wandb_mode.resolve(logger.get("wandb_mode", "auto"))[0], sweep_dir
                    )[0],  # offline when the sweep's runs found online off
                    group=config.sweep.name or "/".join(sweep_dir.parts[-2:]),
                    out_dir=sweep_dir,
                )
        except Exception as exc:
            log.warning("W&B: claims of %s not logged: %s", sweep_dir, exc)
        line = wandb_mode.sync_line(sweep_dir)  # once per sweep, its runs' and its claims'
        if line:
            print(line)


def _statuses(sweep_dir: Path) -> list[str]:
    """Every job's status (a job without a readable summary.json counts as failed)."""
    from stalebench.report.collect import find_run_dirs

    out = []
    for run_dir in find_run_dirs([sweep_dir]) if sweep_dir.is_dir() else []:
        try:
            out.append(json.loads((run_dir / "summary.json").read_text())["status"])
        except (OSError, ValueError, KeyError):
            out.append("failed")
    return out


class StopOnSignal(Callback):
    """SIGINT or SIGTERM to a multirun's top process (SLURM's scancel), or to its whole
    process group (Ctrl-C), stops the multirun: every job under way ends `interrupted`,
    recorded as a single run records itself; no job starts after; no process is left; the
    CLI exits with 128 + the signal.

    Hydra's basic launcher runs the jobs in this process, where a run records itself
    (`experiment.recording_interrupts`). The joblib launcher runs them in loky workers:
    the signal is forwarded to each (a signal to the group reached them already), loky's
    executor is shut down once their jobs have ended — at most `STOP_S`, then the workers
    left are killed, and their runs' ranks die with them — and `Interrupted` is raised
    here. The workers keep a signal for later outside a run from their start
    (`signals.defer`, as loky's initializer): one dead of it would make loky kill the
    others before their runs were recorded."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._previous = {}
        if threading.current_thread() is not threading.main_thread():
            return  # no signal handler can be set outside the main thread
        if "joblib" in str(config.hydra.launcher.get("_target_", "")):
            _defer_signals_in_loky_workers()
        self._previous = {s: signal.signal(s, _stop_jobs) for s in SIGNALS}

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def _defer_signals_in_loky_workers() -> None:
    """Every loky executor made in this process starts its workers with `signals.defer`:
    Hydra's joblib launcher asks joblib for its "loky" backend by name."""
    from joblib.parallel import LokyBackend, register_parallel_backend

    register_parallel_backend("loky", functools.partial(LokyBackend, initializer=signals.defer))


def _stop_jobs(signum: int, _frame) -> None:
    """The top process's handler during a multirun (`StopOnSignal`)."""
    for s in SIGNALS:  # one interruption: the wind-down is not interrupted again
        signal.signal(s, signal.SIG_IGN)
    executor = _loky_executor()
    if executor is not None:
        workers = list(executor._processes.values())
        for worker in workers:  # a run under way records itself interrupted
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signum)
        # the jobs under way end, those queued are refused (signals.deferred), then the
        # workers exit
        ender = threading.Thread(target=executor.shutdown, daemon=True)
        ender.start()
        ender.join(STOP_S)
        if ender.is_alive():
            log.warning("%s: jobs still running %.0f s later, killed", Interrupted(signum), STOP_S)
            for worker in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signal.SIGKILL)
    raise Interrupted(signum)


def _loky_executor():
    """The loky executor of this process's joblib (one at most), or None."""
    module = sys.modules.get("joblib.externals.loky.reusable_executor")
    return getattr(module, "_executor", None)
