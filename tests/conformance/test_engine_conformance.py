"""Every registered engine, in each runtime it declares: a short run completes and writes the
run-directory contract; a worker's death ends it with summary.json written (or the engine
goes on without the worker, when it says it survives that loss); its update events name
only its own workers; and each profile field that shapes time is honoured (the simulated
wall time changes) or refused before any process starts, naming the key. The engines come
from the registry and the algorithm for each from the presets (the first one the engine
accepts): an engine registered later is checked here without a test written for it."""

from __future__ import annotations

import functools
import json

import pytest

from stalebench import experiment
from stalebench.config import ENGINES
from stalebench.errors import ConfigError
from stalebench.plugins import load as load_plugins
from tests.conftest import compose, preset_engines
from tests.speed_helpers import fork_server_for_every_engine

load_plugins()

SMALL = [
    "budget.max_updates=12",
    "budget.max_wall_s=0",
    "eval.every_s=0",
    "eval.every_updates=6",
    "eval.train_samples=0",
    "logger=none",
    "timeout_s=60",
    # the contract, not the step times: a pipeline's 4 transformer stages at 20 ms a step
    # need ~3.2 of a 2-core machine's cores (refused without it)
    "oversubscribe=true",
]
CONTRACT = ("events.jsonl", "summary.json", "metrics.parquet", "model.pt")
# what each check needs is an engine's rounds, not a model's: the smallest model and data,
# and a local-update preset's rounds shortened, wherever the preset takes them (tried in
# this order for each preset; a pipeline's stages keep the transformer their preset names)
LIGHT = ("model=mlp", "model.hidden=[32]", "dataset=synthetic")
SHORT = ("algorithm.outer.inner_steps=5",)
LIGHTER = (LIGHT + SHORT, LIGHT, SHORT, ())


@functools.cache
def every_preset() -> dict[str, str]:
    """`preset_engines()`, composed once for the module (27 presets: seconds)."""
    return preset_engines()


@functools.cache
def example(engine: str) -> tuple[str, ...]:
    """Overrides for a small run of `engine`: its own preset if it has one, else the first
    preset it accepts (by name order), made as light as that preset allows (`LIGHTER`)."""
    presets = every_preset()
    ordered = sorted(presets, key=lambda p: (presets[p] != engine, p))
    for preset in ordered:
        for lighter in LIGHTER:
            overrides = (
                f"algorithm={preset}", f"engine={engine}", "cluster=homogeneous", *SMALL, *lighter
            )  # fmt: skip
            try:
                experiment.prepare(compose(list(overrides)))
            except Exception:  # refused, or does not compose with this engine's config
                continue
            return overrides
    raise AssertionError(f"engine={engine} accepts no preset")


@pytest.fixture(scope="module", autouse=True)
def one_fork_server():
    """The real runs go from engine to engine: their ranks forked from one server."""
    fork_server_for_every_engine()


CASES = [
    pytest.param(name, runtime, id=f"{name}-{runtime}")
    for name in ENGINES.names()
    for runtime in ENGINES.get(name)[0].runtimes
]


def run(tmp_path, name: str, runtime: str, *overrides: str):
    overrides = [*example(name), f"runtime={runtime}", *overrides]
    cfg = compose(overrides)
    cfg.run_dir = str(tmp_path)
    engine = experiment.prepare(cfg)  # once: the run below is in a fresh directory
    return experiment.launch(cfg, engine), engine


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name,runtime", CASES)
def test_an_engine_completes_and_writes_the_contract(tmp_path, name, runtime):
    from stalebench.metrics.events import read_events, schema_errors

    summary, engine = run(tmp_path, name, runtime)
    assert summary["status"] == "completed", summary["error"]
    assert all((tmp_path / f).exists() for f in CONTRACT)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    events = read_events(tmp_path / "events.jsonl")
    assert not [e for e in events if schema_errors(e)]
    assert (events[0]["event"], events[-1]["event"]) == ("start", "end")
    workers = {e["worker"] for e in events if e["kind"] == "update"}
    assert workers and workers <= set(range(engine.num_workers))
    assert summary["num_workers"] == engine.num_workers


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name,runtime", CASES)
def test_a_workers_death_ends_the_run_with_its_summary(tmp_path, name, runtime):
    die = "cluster.faults=[{worker:1,at_step:3,action:die}]"
    try:
        summary, engine = run(tmp_path, name, runtime, die)
    except ConfigError as refused:
        assert "cluster.faults" in str(refused)
        return
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["status"] == summary["status"]
    rank = next(r for r in range(engine.world_size()) if "worker 1" in engine.rank_name(r))
    expected = "completed" if engine.survives_loss_of(rank) else "failed"
    assert summary["status"] == expected, summary["error"]
    if expected == "failed":
        assert "worker 1" in summary["error"], summary["error"]


# what each field does to a 2-worker run's time when it is honoured
FIELDS = {
    "slowdown": "cluster.slowdown=[1,3]",
    "push_latency_ms": "cluster.push_latency_ms=40",
    "pull_latency_ms": "cluster.pull_latency_ms=40",
    "push_bandwidth_gbps": "cluster.push_bandwidth_gbps=0.0001",
    "faults": "cluster.faults=[{worker:0,at_step:2,duration_s:0.5}]",
}


@pytest.fixture(scope="module")
def plain_runs(tmp_path_factory):
    """engine -> the 2-worker simulated run each field's run is compared with (the same for
    every field: run once per engine)."""
    runs: dict[str, dict] = {}

    def plain(name: str) -> dict:
        if name not in runs:
            where = tmp_path_factory.mktemp(f"plain-{name}")
            runs[name], _ = run(where, name, "sim", "cluster.num_workers=2")
        return runs[name]

    return plain


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "name", [n for n in ENGINES.names() if "sim" in ENGINES.get(n)[0].runtimes]
)
@pytest.mark.parametrize("field", FIELDS)
def test_each_timing_field_is_honoured_or_refused_by_name(tmp_path, plain_runs, name, field):
    base = ["cluster.num_workers=2"]
    try:
        changed, _ = run(tmp_path / "changed", name, "sim", *base, FIELDS[field])
    except ConfigError as refused:
        assert f"cluster.{field}" in str(refused)
        return
    plain = plain_runs(name)
    assert changed["status"] == plain["status"] == "completed", changed["error"]
    assert changed["run_time_s"] > plain["run_time_s"], (field, changed["run_time_s"])
