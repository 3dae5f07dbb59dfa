"""A new engine is one module and a decorator: the smallest engine of docs/engines.md (one
process trains alone, no server, no messages) is taken from the guide as it stands,
imports and all, written to a module outside the package, registered by importing it, and
run through the normal CLI path in both runtimes. The spawned processes of the real
runtime find it on PYTHONPATH, as they would a user's module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def guide_example() -> str:
    guide = (ROOT / "docs" / "engines.md").read_text()
    return guide.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    """A directory outside the package holding the guide's engine as `guide_engine.py`."""
    where = tmp_path_factory.mktemp("user")
    (where / "guide_engine.py").write_text(guide_example())
    return where


COMMON = [
    "cluster=homogeneous",
    "cluster.num_workers=1",
    "cluster.compute_ms=5",
    "dataset=synthetic",
    "model=mlp",
    "algorithm=asp",
    "budget.max_updates=40",
    "budget.max_wall_s=0",
    "eval.every_s=0",
    "eval.every_updates=20",
    "logger=none",
    "seed=5",
]


def launch(outside: Path, run_dir: Path, *overrides: str, timeout: int = 150):
    """The normal CLI entry (`stalebench.cli.main`), with the user's module imported first."""
    code = "import guide_engine; from stalebench.cli import main; main()"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(outside), str(ROOT)])}
    return subprocess.run(
        [sys.executable, "-c", code, *COMMON, f"run_dir={run_dir}", *overrides],
        cwd=outside, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def cli(outside: Path, run_dir: Path, *overrides: str) -> dict:
    out = launch(outside, run_dir, *overrides)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.timeout(300)
def test_the_guides_engine_registered_from_outside_runs_in_both_runtimes(tmp_path, outside):
    sim = cli(outside, tmp_path / "sim", "engine=sequential", "runtime=sim")
    real = cli(outside, tmp_path / "real", "engine=sequential", "runtime=real")
    for s in (sim, real):
        assert (s["status"], s["engine"], s["updates"], s["num_workers"]) == (
            "completed",
            "sequential",
            40,
            1,
        )
        assert s["final"]["accuracy"] > 0.5  # it trains (chance is 0.25)
    assert real["run_time_s"] >= 40 * 0.005  # each step lasted the profile's step time
    # the same numbers as a parameter server with one ASP worker: SGD on one stream
    cli(outside, tmp_path / "ps", "engine=ps", "runtime=sim")
    for run in ("sim", "real"):
        ours = torch.load(tmp_path / run / "model.pt")
        theirs = torch.load(tmp_path / "ps" / "model.pt")
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs), run


def test_the_guides_engine_is_one_small_module():
    """The guide's engine, imports, hooks and program together, fits on one screen."""
    assert len(guide_example().strip().splitlines()) <= 55


@pytest.mark.timeout(300)
def test_the_guides_engine_strikes_its_faults_in_both_runtimes(tmp_path, outside):
    """A pause lengthens the run by its duration; a death ends it `failed`, summary.json
    written, in each runtime."""
    pause = "cluster.faults=[{worker:0,at_step:5,duration_s:0.3}]"
    for runtime in ("sim", "real"):
        s = cli(
            outside, tmp_path / f"p-{runtime}", "engine=sequential", f"runtime={runtime}", pause
        )
        assert s["status"] == "completed" and s["run_time_s"] >= 40 * 0.005 + 0.3, runtime
        die = "cluster.faults=[{worker:0,at_step:5,action:die}]"
        run_dir = tmp_path / f"d-{runtime}"
        launch(outside, run_dir, "engine=sequential", f"runtime={runtime}", die)
        s = json.loads((run_dir / "summary.json").read_text())
        assert s["status"] == "failed" and "worker 0" in s["error"], (runtime, s["error"])
        assert "fault injected by cluster.faults" in s["error"], (runtime, s["error"])


def test_an_engine_refuses_the_profile_fields_it_does_not_model(tmp_path, outside):
    out = launch(outside, tmp_path, "engine=sequential", "cluster.push_latency_ms=3", timeout=60)
    assert out.returncode == 2
    assert "cluster.push_latency_ms=3.0: engine=sequential does not model this" in out.stderr
