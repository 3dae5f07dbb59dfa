"""A new engine that brings its own kind of algorithm is its package plus its conf files:
tests/engine_plugin/stalebench_lone (one module, one preset) registers engine `lone` and a
registry of *step rules* (`algorithm/step=`), and is installed here as a
`stalebench.plugins` entry point (a dist-info folder on PYTHONPATH, as pip would leave
one). Nothing in stalebench names it: the schema gets `algorithm.step`, the CLI checks its
names, `stalebench list` shows them, its preset is found, and runs are labelled by it, in
both runtimes. The commands are forked by one driver that imported the CLI and torch once
(tests/cli_driver.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.cli_driver import case, drive

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "tests" / "engine_plugin"
COMMON = [
    "cluster=homogeneous",
    "cluster.compute_ms=5",
    "dataset=synthetic",
    "model=mlp",
    "budget.max_updates=30",
    "budget.max_wall_s=0",
    "eval.every_s=0",
    "eval.every_updates=15",
    "logger=none",
]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, str]:
    """The environment of a user who installed the plugin: its entry point's metadata."""
    site = tmp_path_factory.mktemp("site")
    info = site / "stalebench_lone-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: stalebench-lone\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[stalebench.plugins]\nlone = stalebench_lone\n")
    path = os.pathsep.join(str(p) for p in (PLUGIN, site, ROOT))
    return {**os.environ, "PYTHONPATH": path}


@pytest.fixture(scope="module")
def ran(installed, tmp_path_factory) -> dict[str, dict]:
    """Every `stalebench` command of this file, run once, two at a time, by one driver that
    imported the CLI and torch once (tests/cli_driver.py), in the plugin's user's
    environment: case id -> the case, its exit code, stdout and stderr."""
    tmp = tmp_path_factory.mktemp("own_kind")

    def run(case_id: str, *overrides: str) -> dict:
        run_dir = tmp / case_id
        args = [*COMMON, f"run_dir={run_dir}", f"hydra.run.dir={run_dir}", *overrides]
        return case(case_id, tmp, args)

    cases = [
        *[run(r, "algorithm=lone_sign", f"runtime={r}") for r in ("sim", "real")],
        run("sgd", "algorithm=lone_sign", "algorithm/step=sgd", "runtime=sim"),
        case("list", tmp, ["list"]),
        case("bad", tmp, ["algorithm=lone_sign", "algorithm/step=nope"]),
        case("cost", tmp, ["algorithm=lone_sign", "runtime=sim", "sim.numerics=false"]),
    ]
    return drive(cases, installed, at_once=2)


def summary(done: dict) -> dict:
    assert done["code"] == 0, done["stderr"][-3000:]
    return json.loads((Path(done["cwd"]) / done["id"] / "summary.json").read_text())


def test_the_plugin_is_a_module_and_a_preset():
    files = sorted(
        str(p.relative_to(PLUGIN))
        for p in PLUGIN.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert files == ["stalebench_lone/__init__.py", "stalebench_lone/conf/algorithm/lone_sign.yaml"]


@pytest.mark.timeout(600)
def test_an_engine_with_its_own_kind_runs_from_its_preset_in_both_runtimes(ran):
    for runtime in ("sim", "real"):
        s = summary(ran[runtime])
        assert (s["status"], s["engine"], s["algorithm"], s["updates"]) == (
            "completed", "lone", "lone_sign", 30,
        )  # fmt: skip
        assert s["parts"] == {"step": "sign"} and s["barrier"] is None  # its own kind
        assert s["final"]["accuracy"] > 0.5  # it trains (chance is 0.25)
    # a swapped part of its kind relabels the run by its parts, and changes what runs
    sgd = summary(ran["sgd"])
    assert sgd["algorithm"] == "sgd"
    assert sgd["final"]["loss"] != summary(ran["sim"])["final"]["loss"]


@pytest.mark.timeout(600)
def test_its_kind_is_listed_and_its_names_are_checked(ran):
    listed = ran["list"]
    assert listed["code"] == 0, listed["stderr"]
    text = listed["stdout"]
    assert "step rules (algorithm/step=)" in text
    names = {line.split()[0] for line in text.splitlines() if line.startswith("  ")}
    assert {"lone", "sgd", "sign", "lone_sign"} <= names
    bad = ran["bad"]
    assert bad["code"] == 2
    assert "algorithm/step: unknown 'nope'" in bad["stderr"]
    # an engine that does not declare `cost_only` is refused a cost-only run, by key
    cost = ran["cost"]
    assert cost["code"] == 2
    assert (
        "sim.numerics=false: engine=lone does not run cost-only (engines that do: allreduce, "
        "gossip, local, pipeline, ps)" in cost["stderr"]
    )
