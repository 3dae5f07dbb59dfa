"""Hydra callbacks: at the end of a multirun, write the sweep's report."""

from __future__ import annotations

import logging
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("stalebench")


class ReportOnSweepEnd(Callback):
    """Runs `stalebench-report` on the sweep directory; a report failure is logged, never
    raised (the runs themselves are already on disk)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            from stalebench.report.cli import main

            main([str(config.hydra.sweep.dir)])
        except Exception as exc:
            log.warning("stalebench-report failed on %s: %s", config.hydra.sweep.dir, exc)
