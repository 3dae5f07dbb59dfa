"""examples/own_data (docs/models-and-data.md): a researcher's own dataset (CSV files) and
model (a residual MLP), installed as a package with an entry point, train in both runtimes
and in a sweep with its report; a bad path is refused by name before anything starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stalebench.metrics.events import read_events

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_data"
CLI = [sys.executable, "-m", "stalebench.cli"]
RUN = ["dataset=csv", "model=resmlp", "algorithm.update.lr=0.05", "logger=none"]


def run(cmd: list[str], env: dict[str, str], cwd: Path, code: int = 0, timeout: int = 180):
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == code, f"{cmd}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[dict[str, str], Path]:
    """The example installed as a user would (pip, from its pyproject; here into a folder on
    PYTHONPATH rather than the environment), and a spirals table made by its generator."""
    tmp = tmp_path_factory.mktemp("own_data")
    site = tmp / "site"
    pip = ["pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(site)]
    subprocess.run([sys.executable, "-m", *pip, str(EXAMPLE)], check=True, timeout=120)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    made = run([sys.executable, "-m", "stalebench_tabular.spirals", "data"], env, tmp)
    assert "train.csv (3000 rows)" in made.stdout
    return env, tmp


def test_the_generator_writes_a_table_in_the_format_the_dataset_reads(installed):
    _, tmp = installed
    for split, rows in (("train", 3000), ("test", 600)):
        lines = (tmp / "data" / f"{split}.csv").read_text().splitlines()
        assert lines[0] == "x1,x2,label" and len(lines) == rows + 1
        assert {line.rsplit(",", 1)[1] for line in lines[1:]} == {"0", "1", "2"}


def test_the_plugin_is_listed_beside_the_built_ins(installed):
    env, tmp = installed
    datasets = run([*CLI, "list", "dataset"], env, tmp).stdout
    assert "  csv " in datasets and "  mnist1d " in datasets
    assert "  resmlp " in run([*CLI, "list", "model"], env, tmp).stdout


@pytest.mark.parametrize(
    "override, said",
    [
        ("dataset.dir=nowhere", "stalebench: error: dataset.dir=nowhere: no train.csv in it"),
        ("dataset.label=y", "stalebench: error: dataset.label='y': not a column of data/"),
        ("model.widht=8", "stalebench: error: model.widht: no such config key; did you mean "),
        ("model.blocks=0", "stalebench: error: model.blocks must be >= 1, got 0"),
    ],
)
def test_bad_input_is_refused_by_name_before_anything_starts(installed, override, said):
    env, tmp = installed
    args = [*RUN, "dataset.dir=data", override, f"hydra.run.dir={tmp / 'refused'}"]
    done = run([*CLI, *args], env, tmp, code=2)
    assert done.stderr.startswith(said), done.stderr
    assert not (tmp / "refused" / "events.jsonl").exists()


@pytest.mark.parametrize("runtime", ["sim", "real"])
def test_it_trains_in_both_runtimes(installed, runtime):
    env, tmp = installed
    run_dir = tmp / f"run-{runtime}"
    budget = ["budget.max_updates=300", "budget.max_wall_s=0", "eval.every_s=0"]
    setup = ["cluster=homogeneous", "cluster.num_workers=2", "cluster.compute_ms=5"]
    if runtime == "sim":
        setup = ["runtime=sim", "cluster.num_workers=4"]
    args = [*RUN, "dataset.dir=data", *setup, *budget, "eval.every_updates=100"]
    run([*CLI, *args, "algorithm=ssp", f"hydra.run.dir={run_dir}"], env, tmp)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["runtime"]) == ("completed", runtime)
    assert (summary["dataset"], summary["model"], summary["updates"]) == ("csv", "resmlp", 300)
    tests = [e for e in read_events(run_dir / "events.jsonl") if e.get("split") == "test"]
    assert tests[-1]["loss"] < tests[0]["loss"]  # it learns from the table
    assert summary["final"]["accuracy"] > summary["chance_accuracy"] + 0.1


def test_a_sweep_on_it_writes_its_report(installed):
    env, tmp = installed
    sweep = tmp / "sweep"
    args = ["-m", *RUN, "dataset.dir=data", "runtime=sim", "cluster.num_workers=4"]
    args += ["algorithm=asp,ssp", "seed=0", "budget.max_updates=150"]
    args += ["budget.max_wall_s=0", "eval.every_s=0", "eval.every_updates=50"]
    run([*CLI, *args, f"hydra.sweep.dir={sweep}"], env, tmp)
    report = (sweep / "report.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith(("| asp |", "| ssp |"))]
    assert len(rows) == 2, report[:2000]
    assert all(json.loads(p.read_text())["dataset"] == "csv" for p in sweep.glob("*/summary.json"))
