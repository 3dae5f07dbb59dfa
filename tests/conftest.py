"""Shared fixtures: an isolated data cache, config composition that restores Hydra's
global state, and a helper that runs a real job into a temporary run directory."""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import socket
from pathlib import Path
from typing import NamedTuple

import pytest

os.environ.setdefault("STALEBENCH_CACHE", str(Path(__file__).parent / ".cache"))
# no user profiles (`stalebench calibrate` writes them) on the config search path
os.environ["STALEBENCH_CONF"] = str(Path(__file__).parent / ".no-user-conf")

# summary.json's fields as docs/design.md's run-directory contract lists them
SUMMARY_FIELDS = {
    "status",
    "error",
    "algorithm",
    "parts",
    "barrier",
    "update_rule",
    "engine",
    "runtime",
    "model",
    "dataset",
    "cluster",
    "num_workers",
    "seed",
    "clock",
    "run_time_s",
    "updates",
    "final",
    "final_tail",
    "best_accuracy",
    "time_to_target_s",
    "lag",
    "max_clock_gap",
    "compute_fraction",
    "throughput_updates_per_s",
    "bytes_sent",
}

# Small, fast real runs: synthetic data, tiny MLP, a few ms of emulated compute per step.
FAST = [
    "dataset=synthetic",
    "model=mlp",
    "model.hidden=[32]",
    "cluster=homogeneous",
    "cluster.compute_ms=5",
    "budget.max_wall_s=0",
    "eval.every_s=0",
    "eval.every_updates=20",
    "timeout_s=30",
    # one gradient at a time: tests compare paths bit for bit (an engine against another,
    # the simulator against real processes); batched gradients, equal to float rounding,
    # are tested on their own (tests/unit/test_sim_batch.py)
    "sim.batch=off",
    # the suite runs small real clusters on a shared machine, two pytest workers at once:
    # 4 FAST workers need ~1.95 of 2 cores at the profile's pace, so the pre-spawn check
    # (tests/integration/test_oversubscribe.py tests it) would refuse them whenever the
    # other pytest worker loads the machine; what these tests check is not the pace
    "oversubscribe=true",
]


# `stalebench -m +sweep=dssp` at a tiny scale: two of its arms, two seeds, 2 workers, 1 s
# a sweep's tuning stage at its least (one point, one seed, no extension) and no second
# stage of seeds: for tests whose subject is not the protocol (tests/integration/test_tuning.py)
LEAST_STAGES = [
    "sweep.tune.params={algorithm.update.lr:[0.1]}",
    "sweep.tune.max_extensions=0",
    "sweep.tune.seeds=[1000]",
    "sweep.sequential.max_seeds=0",
]
TINY_DSSP_SWEEP = [
    "-m",
    "+sweep=dssp",
    "+sweep/arms/dssp=bsp,dssp",
    "cluster=heterogeneous",
    "seed=0,1",
    "cluster.num_workers=2",
    "budget.max_wall_s=1",
    "eval.every_s=0.25",
    "dataset=synthetic",
    "model=mlp",
    "model.hidden=[16]",
    "sim.batch=off",  # one gradient at a time: at 2 workers, batches cost more than they save
    "hydra.sweep.dir=sweep",
]


def fast_with(overrides: list[str]) -> list[str]:
    """FAST then `overrides`; a group the overrides swap (model=cnn) drops FAST's settings
    inside that group (model.hidden), which would not fit the new choice."""
    swapped = {o.partition("=")[0] for o in overrides if "." not in o.partition("=")[0]}
    kept = [
        o
        for o in FAST
        if "." not in (key := o.partition("=")[0]) or key.split(".")[0] not in swapped
    ]
    return kept + overrides


def _choices_and_values(overrides: list[str]):
    """Hydra's own split of `overrides` (its defaults_list.Overrides, against the initialized
    repository): the group choices, as given, and the value overrides, parsed; None where
    Hydra itself should decide (hydra.*, sweeps, a group override it refuses)."""
    from hydra._internal.defaults_list import Overrides
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    if any(o.is_hydra_override() or o.is_sweep_override() for o in parsed):
        return None
    try:
        values = Overrides(GlobalHydra.instance().config_loader().repository, parsed)
    except Exception:  # a bad group override: Hydra's compose names it
        return None
    ids = {id(o) for o in values.config_overrides}
    return tuple(o.input_line for o in parsed if id(o) not in ids), values.config_overrides


def _config_sources() -> tuple:
    """What a composition reads besides the ConfigStore: the repository's sources, and every
    file of the file:// ones and of stalebench's own conf/ (its path, size and mtime), so
    that a profile a test writes, or a search path it adds, is composed anew."""
    from importlib.resources import files

    from hydra.core.global_hydra import GlobalHydra

    sources = GlobalHydra.instance().config_loader().repository.get_sources()
    folders = [str(files("stalebench.conf"))]
    folders += [s.path for s in sources if s.scheme() == "file"]
    seen = []
    for folder in folders:
        for root, _, names in os.walk(folder, followlinks=True):
            for name in names:
                with contextlib.suppress(OSError):
                    st = os.stat(os.path.join(root, name))
                    seen.append((root, name, st.st_size, st.st_mtime_ns))
    return tuple((s.provider, s.scheme(), s.path) for s in sources), tuple(sorted(seen))


def _stored_nodes() -> list:
    """Every node of Hydra's ConfigStore (held, and compared by identity: a registration
    that replaces one, or adds one, composes anew)."""
    from hydra.core.config_store import ConfigStore

    nodes, todo = [], [ConfigStore.instance().repo]
    while todo:
        for name, node in sorted(todo.pop().items()):
            (todo.append(node) if isinstance(node, dict) else nodes.append((name, node)))
    return nodes


class ChoicesComposedOnce:
    """hydra.compose with the defaults tree of each set of group choices composed once a
    process: Hydra composes the choices alone (its defaults list, the configs merged:
    most of a composition's time), and each call gets a copy with its value overrides
    applied by Hydra's own step (ConfigLoaderImpl._apply_overrides_to_config, what
    hydra.compose does after composing the defaults: value overrides never change the
    defaults list). A composition Hydra must decide itself (hydra.* or sweep overrides, a
    group it refuses, the Hydra config returned) is Hydra's compose, as is one whose
    sources or ConfigStore changed since (tests/unit/test_shared_compose.py checks it)."""

    def __init__(self, hydra_compose):
        self.hydra_compose = hydra_compose
        self.composed: dict[tuple, tuple[list, object]] = {}

    def __call__(self, config_name=None, overrides=None, return_hydra_config=False, **kwargs):
        from hydra._internal.config_loader_impl import ConfigLoaderImpl

        split = None if return_hydra_config or kwargs else _choices_and_values(overrides or [])
        if split is None:
            return self.hydra_compose(config_name, overrides, return_hydra_config, **kwargs)
        choices, values = split
        key, nodes = (config_name, choices, _config_sources()), _stored_nodes()
        held = self.composed.get(key)
        if (
            held is None
            or len(held[0]) != len(nodes)
            or any(a != b or x is not y for (a, x), (b, y) in zip(held[0], nodes, strict=True))
        ):
            held = self.composed[key] = (nodes, self.hydra_compose(config_name, list(choices)))
        cfg = copy.deepcopy(held[1])
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        return cfg


@pytest.fixture(scope="session", autouse=True)
def choices_composed_once():
    """Every composition of the session through `ChoicesComposedOnce` (stalebench.cli's
    compose_run calls hydra.compose): a choice of groups composed once a process, not once
    a test."""
    import hydra

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hydra, "compose", ChoicesComposedOnce(hydra.compose))
        yield


def compose(overrides: list[str]):
    """The validated RunConfig for CLI-style overrides (Hydra's global state restored)."""
    from stalebench.cli import compose_run

    return compose_run(overrides)


class Result(NamedTuple):
    summary: dict
    events: list[dict]
    dir: Path


def run_job(run_dir: Path, overrides: list[str]) -> Result:
    """Run one real job (server + worker processes) into run_dir."""
    from stalebench import experiment
    from stalebench.metrics.events import read_events

    cfg = compose(fast_with(overrides))
    cfg.run_dir = str(run_dir)
    summary = experiment.run(cfg)
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    return Result(summary, read_events(run_dir / "events.jsonl"), run_dir)


@pytest.fixture
def wandb_home(tmp_path, monkeypatch):
    """W&B's directories under tmp_path, and none of the settings a user's shell might hold
    (the sinks must not depend on them)."""
    for var, sub in (("WANDB_DIR", ""), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "cfg")):
        monkeypatch.setenv(var, str(tmp_path / sub))
    for var in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_SILENT", "WANDB_QUIET", "WANDB_REINIT"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def job(tmp_path):
    """job(*overrides) runs a real job into a fresh directory under tmp_path."""
    count = iter(range(1000))
    return lambda *overrides: run_job(tmp_path / f"run{next(count)}", list(overrides))


def preset_engines() -> dict[str, str]:
    """Every algorithm preset and the engine it composes to (`algorithm=<preset>`): composed
    once a process (six test modules collect from it; 27 compositions each were seconds of
    every worker's collection)."""
    return dict(_preset_engines())


@functools.cache
def _preset_engines() -> tuple[tuple[str, str], ...]:
    from importlib.resources import files

    names = [
        f.name.removesuffix(".yaml")
        for f in files("stalebench.conf").joinpath("algorithm").iterdir()
        if f.name.endswith(".yaml")
    ]
    return tuple((n, preset(n).engine.name) for n in sorted(names))


@functools.cache
def preset(name: str):
    """The RunConfig of `algorithm=<name>` as shipped, composed once a process (the presets'
    engines and parts are read at collection by several modules): read it, never change it
    (`compose` gives a config of one's own)."""
    return compose([f"algorithm={name}"])


def assert_valid_and_learning(events: list[dict]) -> None:
    """Every event matches the schema, and the training loss fell from the first snapshot
    to the last (the conformance suites' check of a run's events)."""
    from stalebench.metrics.events import schema_errors

    bad = [(e, schema_errors(e)) for e in events if schema_errors(e)]
    assert not bad, bad[:3]
    train = sorted(
        (e for e in events if e["kind"] == "eval" and e["split"] == "train"),
        key=lambda e: e["version"],
    )
    assert train[-1]["loss"] < train[0]["loss"], (train[0], train[-1])


def free_port() -> int:
    """A port free on loopback now (an ephemeral one, for a process group a test forms)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def processes_left(root: Path, wait_s: float = 10.0) -> list[int]:
    """The processes still running in a directory under `root` (their working directory),
    after waiting up to `wait_s` for them to end: what a test's launch left behind."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    cwd = os.readlink(proc / "cwd")
                except OSError:
                    continue
                if cwd == str(root) or cwd.startswith(f"{root}/"):
                    left.append(int(proc.name))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)
