"""Reports: run directories → tidy DataFrames → tables and figures.

This package reads only what a run directory holds (``summary.json``, ``events.jsonl``,
``.hydra/config.yaml``) and imports nothing from the engines, runtimes or experiment code,
so it works on a directory copied to a machine without torch.
"""

from stalebench.report.collect import collect, find_run_dirs, read_events

__all__ = ["collect", "find_run_dirs", "read_events"]
