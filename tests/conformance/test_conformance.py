"""Every registered barrier and update rule, and every preset, in both runtimes: a few
steps with a server and 3 workers on CPU (and every update rule that takes a round's mean
on engine=allreduce's 3 replicas); loss falls; no deadlock within the timeout; events
match the schema; summary.json complete. New registrations are picked up here without a
new test."""

from __future__ import annotations

import pytest

from stalebench.algorithms import BARRIERS, UPDATES
from stalebench.job import config_sha
from stalebench.plugins import load as load_plugins
from tests.conftest import (
    SUMMARY_FIELDS,
    assert_valid_and_learning,
    compose,
    fast_with,
    preset_engines,
    run_job,
)

load_plugins()
# the pipeline and local-update presets: test_pipeline_conformance.py, test_local_conformance.py
PRESETS = [p for p, e in preset_engines().items() if e not in ("pipeline", "local", "gossip")]
# Each barrier with plain SGD; each update rule behind ASP; each preset as shipped.
CASES = (
    [
        pytest.param([f"algorithm/barrier={b}", "algorithm/update=sgd"], id=f"barrier-{b}")
        for b in BARRIERS.names()
    ]
    + [
        pytest.param(["algorithm/barrier=asp", f"algorithm/update={u}"], id=f"update-{u}")
        for u in UPDATES.names()
    ]
    + [pytest.param([f"algorithm={p}"], id=f"preset-{p}") for p in PRESETS]
)
COMMON = [
    "cluster.num_workers=3",
    "cluster.slowdown=[1,1.5,2]",
    "budget.max_updates=60",
    "algorithm.update.lr=0.05",
]


def check(summary, events):
    assert summary["status"] == "completed", summary["error"]
    assert SUMMARY_FIELDS <= set(summary)
    assert summary["updates"] == 60
    assert_valid_and_learning(events)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("overrides", CASES)
def test_sim_runtime(tmp_path, overrides):
    check(*run_job(tmp_path, ["runtime=sim", *COMMON, *overrides])[:2])


def _same_as(case_id: str) -> str | None:
    """The barrier or update-rule case whose resolved config a preset's equals beyond the
    algorithm's label (a preset that is exactly a barrier with SGD, or ASP with an update
    rule), or the earlier case of the same overrides, if any: that case runs in real
    processes, this one not again (a few seconds each; in the simulator every case runs).
    Only a preset can resolve as another case does: the barrier and update cases differ by
    the part's name."""
    at = [c.id for c in CASES].index(case_id)
    overrides = CASES[at].values[0]
    if repeated := [c.id for c in CASES[:at] if c.values[0] == overrides]:  # ASP with SGD
        return repeated[0]
    if not overrides[0].startswith("algorithm="):
        return None
    cfg = compose(fast_with([*COMMON, *overrides]))
    barrier, update = cfg.algorithm.barrier.name, cfg.algorithm.update.name
    for case, same in (
        (f"barrier-{barrier}", update == "sgd"),
        (f"update-{update}", barrier == "asp"),
    ):
        if same and (found := [c for c in CASES if c.id == case]):
            other = compose(fast_with([*COMMON, *found[0].values[0]]))
            cfg.algorithm.name = other.algorithm.name = ""
            if config_sha(cfg) == config_sha(other):
                return case
    return None


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("overrides", CASES)
def test_real_runtime(tmp_path, overrides, request):
    if same := _same_as(request.node.callspec.id):
        pytest.skip(f"the config of {same}, which runs in real processes")
    check(*run_job(tmp_path, [*COMMON, *overrides])[:2])


# Each update rule that can take a round's mean (not per worker) on engine=allreduce: BSP
# the way DDP runs it, every replica stepping the rule with the all-reduced mean gradient.
ALLREDUCE_CASES = [
    pytest.param(
        ["engine=allreduce", "algorithm/barrier=bsp", f"algorithm/update={u}"], id=f"allreduce-{u}"
    )
    for u in UPDATES.names()
    if not UPDATES.get(u)[0].per_worker
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("overrides", ALLREDUCE_CASES)
def test_allreduce_sim_runtime(tmp_path, overrides):
    check(*run_job(tmp_path, ["runtime=sim", *COMMON, *overrides])[:2])


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("overrides", ALLREDUCE_CASES)
def test_allreduce_real_runtime(tmp_path, overrides):
    check(*run_job(tmp_path, [*COMMON, *overrides])[:2])


def test_the_test_only_plugin_is_in_the_suite():
    ids = [case.id for case in CASES]
    assert "barrier-test_mean_lead" in ids
    assert {f"preset-{p}" for p in ("bsp", "asp", "ssp")} <= set(ids)
    assert {"allreduce-sgd", "allreduce-adamw"} <= {case.id for case in ALLREDUCE_CASES}
