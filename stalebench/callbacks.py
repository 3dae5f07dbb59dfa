"""Hydra callbacks: at the end of a multirun, write the sweep's report."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("stalebench")

# statuses of the last multirun's jobs (the CLI's exit code of a sweep), set at its end
SWEEP_STATUSES: list[str] = []


class ReportOnSweepEnd(Callback):
    """Runs `stalebench-report` on the sweep directory and, with logger=wandb, logs a paper
    sweep's claim verdicts to W&B; a failure is logged, never raised (the runs themselves
    are already on disk)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        SWEEP_STATUSES[:] = _statuses(sweep_dir)
        try:
            from stalebench.report.cli import main

            main([str(sweep_dir)])
        except Exception as exc:
            log.warning("stalebench-report failed on %s: %s", sweep_dir, exc)
            return
        claims = sweep_dir / "claims.json"
        logger = config.get("logger") or {}
        if logger.get("name") != "wandb" or not claims.is_file():
            return
        try:  # W&B never fails the sweep: claims.json has the verdicts
            from stalebench.metrics.sinks import log_verdicts

            log_verdicts(
                json.loads(claims.read_text())["claims"],
                project=logger.get("project", "stalebench"),
                mode=logger.get("wandb_mode", "offline"),
                group=config.sweep.name or "/".join(sweep_dir.parts[-2:]),
                out_dir=sweep_dir,
            )
        except Exception as exc:
            log.warning("W&B: claims of %s not logged: %s", sweep_dir, exc)


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
