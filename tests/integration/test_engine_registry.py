"""A new engine is one module and a decorator: `Sequential` below (one process trains
alone, no server, no messages) is registered from this test and runs through the normal
CLI path in both runtimes. Run with `python -c "import <this module>; main()"`, the
spawned process of the real runtime finds it by unpickling the engine, which imports this
module again."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from stalebench.algorithms.base import UPDATES
from stalebench.engines.base import ENGINES, NETWORK, Engine, EngineConfig
from stalebench.runtime.faults import pad_to
from stalebench.runtime.record import RunRecord, diverged, gradient, spent

ROOT = Path(__file__).resolve().parents[2]


@ENGINES.register("sequential", EngineConfig)
class Sequential(Engine):
    """One process trains alone with the configured update rule: no server, no messages."""

    ignores = ("faults", *NETWORK)  # one process: no network, and no faults modelled

    @property
    def num_workers(self) -> int:
        return 1

    def run_rank(self, job, rank, ctx):
        return train(job, ctx.run_dir, virtual=False)

    def simulate(self, job, run_dir):
        return train(job, run_dir, virtual=True)


def train(job, run_dir, virtual: bool):
    cfg, record, model = job.cfg, RunRecord(job, run_dir), job.model()
    params = parameters_to_vector(model.parameters()).detach().clone()
    rule = UPDATES.build(cfg.algorithm.update, params, 1)
    net = job.model()
    net_params, batches = list(net.parameters()), job.batches(0)
    t0, t, version, status = time.perf_counter(), 0.0, 0, "completed"
    record.snapshots.maybe(0.0, 0, params)
    while status == "completed" and not spent(cfg.budget, version, t):
        step_s, start = job.profile.step_s(0), time.perf_counter()
        vector_to_parameters(params, net_params)
        grad, loss = gradient(net, net_params, next(batches), torch.device("cpu"))
        if not virtual:
            pad_to(start, step_s)
        t = t + step_s if virtual else time.perf_counter() - t0
        rule.step(params, grad, 0, 0)
        version += 1
        compute = step_s if virtual else time.perf_counter() - start
        record.events.emit(
            "update", t, worker=0, clock=version - 1, version=version, lag=0, loss=loss,
            compute_s=compute, wait_s=0.0, comm_s=0.0, clock_gap=0,
        )  # fmt: skip
        record.snapshots.maybe(t, version, params)
        status = "diverged" if diverged(loss) else status
    return record.finish(model, params, version, t, status, None, bytes_sent=0)


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


def cli(run_dir: Path, *overrides: str) -> dict:
    """The normal CLI entry (`stalebench.cli.main`), with this module imported first."""
    code = "import tests.integration.test_engine_registry; from stalebench.cli import main; main()"
    out = subprocess.run(
        [sys.executable, "-c", code, *COMMON, f"run_dir={run_dir}", *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.timeout(300)
def test_an_engine_registered_from_a_test_runs_in_both_runtimes(tmp_path):
    sim = cli(tmp_path / "sim", "engine=sequential", "runtime=sim")
    real = cli(tmp_path / "real", "engine=sequential", "runtime=real")
    for s in (sim, real):
        assert (s["status"], s["engine"], s["updates"], s["num_workers"]) == (
            "completed",
            "sequential",
            40,
            1,
        )
        assert s["final"]["accuracy"] > 0.5  # it trains (chance is 0.25)
    assert real["wall_time_s"] >= 40 * 0.005  # each step lasted the profile's step time
    # the same numbers as a parameter server with one ASP worker: SGD on one stream
    cli(tmp_path / "ps", "engine=ps", "runtime=sim")
    for run in ("sim", "real"):
        ours = torch.load(tmp_path / run / "model.pt")
        theirs = torch.load(tmp_path / "ps" / "model.pt")
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs), run


def test_the_engine_is_one_small_module():
    """The engine above, hooks and loop together, fits on one screen."""
    source = Path(__file__).read_text()
    engine = source[source.index("@ENGINES.register") : source.index("COMMON = [")]
    assert len(engine.strip().splitlines()) <= 50


def test_the_engine_guide_shows_this_engine_verbatim():
    """docs/engines.md shows the engine above; it must be the code that runs here."""
    guide = (ROOT / "docs" / "engines.md").read_text()
    shown = guide.split("```python\n", 1)[1].split("```", 1)[0]
    source = Path(__file__).read_text()
    engine = source[source.index("@ENGINES.register") : source.index("COMMON = [")]
    assert shown.strip() == engine.replace("  # fmt: skip", "").strip()


def test_an_engine_refuses_the_profile_fields_it_does_not_model(tmp_path):
    code = "import tests.integration.test_engine_registry; from stalebench.cli import main; main()"
    out = subprocess.run(
        [sys.executable, "-c", code, *COMMON, f"run_dir={tmp_path}", "engine=sequential",
         "cluster.push_latency_ms=3"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert "cluster.push_latency_ms=3.0: engine=sequential does not model this" in out.stderr
