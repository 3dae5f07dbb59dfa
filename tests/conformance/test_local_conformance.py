"""Every registered inner optimizer and outer rule, and every local-update preset, in both
runtimes: 4 workers in real processes on CPU, 16 in the simulator; the run completes, its
events match the schema, summary.json is complete, the training loss falls. A new
registration is picked up here without a new test."""

from __future__ import annotations

import pytest

from stalebench.algorithms.local import INNER, OUTER
from stalebench.plugins import load as load_plugins
from tests.conftest import (
    SUMMARY_FIELDS,
    assert_valid_and_learning,
    preset,
    preset_engines,
    run_job,
)

load_plugins()
PRESETS = [p for p, engine in preset_engines().items() if engine == "local"]
CASES = (
    [
        pytest.param(["algorithm=local_sgd", f"algorithm/inner={i}"], id=f"inner-{i}")
        for i in INNER.names()
    ]
    + [
        pytest.param(["algorithm=local_sgd", f"algorithm/outer={o}"], id=f"outer-{o}")
        for o in OUTER.names()
    ]
    + [pytest.param([f"algorithm={p}"], id=f"preset-{p}") for p in PRESETS]
)
# In real processes: every preset, and the parts no preset uses (each process run costs
# about 7 s on 2 cores; a part a preset already runs adds nothing there)
IN_PRESETS = {
    (kind, getattr(preset(p).algorithm, kind).name) for p in PRESETS for kind in ("inner", "outer")
}
REAL_CASES = [
    case
    for case in CASES
    if case.id.startswith("preset-") or tuple(case.id.split("-", 1)) not in IN_PRESETS
]
COMMON = ["algorithm.outer.inner_steps=10", "budget.max_updates=12", "eval.every_updates=4"]


def check(summary, events, workers):
    assert summary["status"] == "completed", summary["error"]
    assert SUMMARY_FIELDS <= set(summary)
    assert summary["updates"] == 12 and summary["num_workers"] == workers
    steps = [e["inner_steps"] for e in events if e["kind"] == "update"]
    assert summary["gradients"] == sum(steps) > 0  # per worker per round, or per arrival
    assert_valid_and_learning(events)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("overrides", CASES)
def test_sim_runtime(tmp_path, overrides):
    sixteen = ["runtime=sim", "cluster.num_workers=16", "dataset.sharding=replicated"]
    check(*run_job(tmp_path, [*sixteen, *COMMON, *overrides])[:2], 16)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("overrides", REAL_CASES)
def test_real_runtime(tmp_path, overrides):
    check(*run_job(tmp_path, ["cluster.num_workers=4", *COMMON, *overrides])[:2], 4)


def test_every_part_and_preset_is_in_the_suite():
    ids = {case.id for case in CASES}
    presets = ("local_sgd", "diloco", "streaming_diloco", "async_diloco", "easgd", "lsgd")
    presets += ("hpsgd",)
    assert {f"preset-{p}" for p in presets} <= ids
    assert {"outer-average", "outer-nesterov", "outer-elastic", "outer-leader"} <= ids


def test_the_real_runtime_runs_every_preset_and_the_parts_none_of_them_uses():
    ids = {case.id for case in REAL_CASES}
    assert "inner-momentum" in ids and "outer-leader" not in ids  # lsgd runs the leader
    assert {f"preset-{p}" for p in PRESETS} <= ids
