"""A new engine is one module and a decorator: the smallest engine of docs/engines.md (one
process trains alone, no server, no messages) is taken from the guide as it stands,
imports and all, written to a module outside the package, registered by importing it, and
run through the normal CLI path in both runtimes. The spawned processes of the real
runtime find it on PYTHONPATH, as they would a user's module. The commands are forked by one
driver that imported the CLI and torch once (tests/cli_driver.py), two at a time."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests.cli_driver import case, drive

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


def command(case_id: str, outside: Path, run_dir: Path, *overrides: str) -> dict:
    """The normal CLI entry (`stalebench.cli.main`), with the user's module imported first
    (tests/cli_driver.py's `case`)."""
    args = [*COMMON, f"run_dir={run_dir}", *overrides]
    return {**case(case_id, outside, args, before="import guide_engine"), "run_dir": str(run_dir)}


PAUSE = "cluster.faults=[{worker:0,at_step:5,duration_s:0.3}]"
DIE = "cluster.faults=[{worker:0,at_step:5,action:die}]"


@pytest.fixture(scope="module")
def ran(outside, tmp_path_factory) -> tuple[dict[str, dict], Path]:
    """Every command of this file, run once, two at a time, in one driver that imported the
    CLI and torch once (the user's module is imported by each command; the spawned
    processes find it on PYTHONPATH): case id -> the case, its exit code, stdout, stderr;
    and the folder of the run directories."""
    runs = tmp_path_factory.mktemp("runs")
    seq = "engine=sequential"
    cases = [
        command("sim", outside, runs / "sim", seq, "runtime=sim"),
        command("real", outside, runs / "real", seq, "runtime=real"),
        command("ps", outside, runs / "ps", "engine=ps", "runtime=sim"),
        *[command(f"{f}-{r}", outside, runs / f"{f[0]}-{r}", seq, f"runtime={r}", fault)
          for r in ("sim", "real") for f, fault in (("pause", PAUSE), ("die", DIE))],
        command("refused", outside, runs / "refused", seq, "cluster.push_latency_ms=3"),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(outside), str(ROOT)])}
    return drive(cases, env, at_once=2), runs


def summary(ran, case_id: str, code: int | None = 0) -> dict:
    """The case's summary.json (its exit code checked first: 0 unless `code` says)."""
    done = ran[0][case_id]
    if code is not None:
        assert done["code"] == code, done["stderr"][-3000:]
    return json.loads((Path(done["run_dir"]) / "summary.json").read_text())


@pytest.mark.timeout(600)
def test_the_guides_engine_registered_from_outside_runs_in_both_runtimes(ran):
    sim, real = summary(ran, "sim"), summary(ran, "real")
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
    summary(ran, "ps")
    runs = ran[1]
    for run in ("sim", "real"):
        ours = torch.load(runs / run / "model.pt")
        theirs = torch.load(runs / "ps" / "model.pt")
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs), run


def test_the_guides_engine_is_one_small_module():
    """The guide's engine, imports, hooks and program together, fits on one screen."""
    assert len(guide_example().strip().splitlines()) <= 55


@pytest.mark.timeout(600)
def test_the_guides_engine_strikes_its_faults_in_both_runtimes(ran):
    """A pause lengthens the run by its duration; a death ends it `failed`, summary.json
    written, in each runtime."""
    for runtime in ("sim", "real"):
        s = summary(ran, f"pause-{runtime}")
        assert s["status"] == "completed" and s["run_time_s"] >= 40 * 0.005 + 0.3, runtime
        s = summary(ran, f"die-{runtime}", code=None)
        assert s["status"] == "failed" and "worker 0" in s["error"], (runtime, s["error"])
        assert "fault injected by cluster.faults" in s["error"], (runtime, s["error"])


@pytest.mark.timeout(600)
def test_an_engine_refuses_the_profile_fields_it_does_not_model(ran):
    out = ran[0]["refused"]
    assert out["code"] == 2
    assert "cluster.push_latency_ms=3.0: engine=sequential does not model this" in out["stderr"]
