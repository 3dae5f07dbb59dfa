"""Every registered pipeline optimizer under each schedule, and every pipeline preset, in
the sim runtime: a 4-stage run completes, events match the schema, validation loss falls.
A new optimizer registration is picked up here without a new test."""

from __future__ import annotations

import pytest

from stalebench.algorithms.pipeline import OPTIMIZERS
from stalebench.plugins import load as load_plugins
from tests.conftest import SUMMARY_FIELDS, preset_engines
from tests.unit.test_pipeline_rules import sim

load_plugins()
PIPELINE_PRESETS = [p for p, engine in preset_engines().items() if engine == "pipeline"]
CASES = [
    pytest.param([f"algorithm/optimizer={o}", f"algorithm.pipeline.schedule={s}"], id=f"{o}-{s}")
    for o in OPTIMIZERS.names()
    for s in ("async_1f1b", "gpipe")
] + [pytest.param([f"algorithm={p}"], id=f"preset-{p}") for p in PIPELINE_PRESETS]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("overrides", CASES)
def test_pipeline_sim(tmp_path, overrides):
    from stalebench.metrics.events import schema_errors

    summary, events = sim(tmp_path, *overrides, "budget.max_updates=30")
    assert summary["status"] == "completed", summary["error"]
    assert SUMMARY_FIELDS <= set(summary) and summary["updates"] == 30
    assert not [e for e in events if schema_errors(e)]
    vals = sorted((e for e in events if e["kind"] == "eval"), key=lambda e: e["version"])
    assert vals[-1]["loss"] < vals[0]["loss"]
