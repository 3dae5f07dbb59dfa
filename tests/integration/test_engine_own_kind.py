"""A new engine that brings its own kind of algorithm is its package plus its conf files:
tests/engine_plugin/stalebench_lone (one module, one preset) registers engine `lone` and a
registry of *step rules* (`algorithm/step=`), and is installed here as a
`stalebench.plugins` entry point (a dist-info folder on PYTHONPATH, as pip would leave
one). Nothing in stalebench names it: the schema gets `algorithm.step`, the CLI checks its
names, `stalebench list` shows them, its preset is found, and runs are labelled by it, in
both runtimes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def stalebench(env, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    code = "from stalebench.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip


def run(env, run_dir: Path, *overrides: str) -> dict:
    out = stalebench(env, *COMMON, f"run_dir={run_dir}", f"hydra.run.dir={run_dir}", *overrides,
                     cwd=run_dir.parent)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads((run_dir / "summary.json").read_text())


def test_the_plugin_is_a_module_and_a_preset():
    files = sorted(
        str(p.relative_to(PLUGIN))
        for p in PLUGIN.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert files == ["stalebench_lone/__init__.py", "stalebench_lone/conf/algorithm/lone_sign.yaml"]


@pytest.mark.timeout(300)
def test_an_engine_with_its_own_kind_runs_from_its_preset_in_both_runtimes(tmp_path, installed):
    for runtime in ("sim", "real"):
        s = run(installed, tmp_path / runtime, "algorithm=lone_sign", f"runtime={runtime}")
        assert (s["status"], s["engine"], s["algorithm"], s["updates"]) == (
            "completed", "lone", "lone_sign", 30,
        )  # fmt: skip
        assert s["parts"] == {"step": "sign"} and s["barrier"] is None  # its own kind
        assert s["final"]["accuracy"] > 0.5  # it trains (chance is 0.25)
    # a swapped part of its kind relabels the run by its parts, and changes what runs
    sgd = run(installed, tmp_path / "sgd", "algorithm=lone_sign", "algorithm/step=sgd",
              "runtime=sim")  # fmt: skip
    assert sgd["algorithm"] == "sgd"
    assert (
        sgd["final"]["loss"]
        != json.loads((tmp_path / "sim" / "summary.json").read_text())["final"]["loss"]
    )


def test_its_kind_is_listed_and_its_names_are_checked(tmp_path, installed):
    listed = stalebench(installed, "list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    text = listed.stdout
    assert "step rules (algorithm/step=)" in text
    names = {line.split()[0] for line in text.splitlines() if line.startswith("  ")}
    assert {"lone", "sgd", "sign", "lone_sign"} <= names
    bad = stalebench(installed, "algorithm=lone_sign", "algorithm/step=nope", cwd=tmp_path)
    assert bad.returncode == 2
    assert "algorithm/step: unknown 'nope'" in bad.stderr
    # an engine that does not declare `cost_only` is refused a cost-only run, by key
    cost = stalebench(installed, "algorithm=lone_sign", "runtime=sim", "sim.numerics=false",
                      cwd=tmp_path)  # fmt: skip
    assert cost.returncode == 2
    assert (
        "sim.numerics=false: engine=lone does not run cost-only (engines that do: allreduce, "
        "gossip, local, pipeline, ps)" in cost.stderr
    )
