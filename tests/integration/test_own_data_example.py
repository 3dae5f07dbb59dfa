"""examples/own_data (docs/models-and-data.md): a researcher's own dataset (CSV files) and
model (a residual MLP), installed as a package with an entry point, train in both runtimes
and in a sweep with its report; a bad path is refused by name before anything starts.

The `stalebench` commands run once, in one driver process that forks a child per command
(tests/cli_driver.py: torch and Hydra imported once, not per command);
each test asserts on the commands it is about (`ran`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stalebench.metrics.events import read_events
from tests.cli_driver import SWEEP_IMPORTS, Driver, case

# the first test runs every command (`ran`): at most 180 s each, as a command's own timeout
# was, two at a time
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_data"
RUN = ["dataset=csv", "model=resmlp", "algorithm.update.lr=0.05", "logger=none"]


def run(cmd: list[str], env: dict[str, str], cwd: Path, code: int = 0, timeout: int = 180):
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == code, f"{cmd}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def user(tmp_path_factory) -> tuple[dict[str, str], Path]:
    """A user's folder, with a folder on PYTHONPATH to install the example into."""
    tmp = tmp_path_factory.mktemp("own_data")
    (tmp / "site").mkdir()
    path = os.pathsep.join(p for p in (str(tmp / "site"), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}, tmp


@pytest.fixture(scope="module")
def driver(user):
    """The driver that forks the `stalebench` commands (tests/cli_driver.py): torch and
    Hydra imported once, while the example is installed."""
    with Driver(user[0], SWEEP_IMPORTS) as driver:
        yield driver


@pytest.fixture(scope="module")
def installed(user, driver) -> tuple[dict[str, str], Path]:
    """The example installed as a user would (pip, from its pyproject; here into a folder on
    PYTHONPATH rather than the environment), and a spirals table made by its generator."""
    env, tmp = user
    pip = ["pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target"]
    subprocess.run([sys.executable, "-m", *pip, str(tmp / "site"), str(EXAMPLE)], check=True,
                   timeout=120)  # fmt: skip
    made = run([sys.executable, "-m", "stalebench_tabular.spirals", "data"], env, tmp)
    assert "train.csv (3000 rows)" in made.stdout
    return env, tmp


BAD = [
    ("dataset.dir=nowhere", "stalebench: error: dataset.dir=nowhere: no train.csv in it"),
    ("dataset.label=y", "stalebench: error: dataset.label='y': not a column of data/"),
    ("model.widht=8", "stalebench: error: model.widht: no such config key; did you mean "),
    ("model.blocks=0", "stalebench: error: model.blocks must be >= 1, got 0"),
]
RUNTIMES = ["sim", "real"]


def training(runtime: str, run_dir: Path) -> list[str]:
    """The arguments of test_it_trains_in_both_runtimes's run in `runtime`."""
    budget = ["budget.max_updates=300", "budget.max_wall_s=0", "eval.every_s=0"]
    setup = ["cluster=homogeneous", "cluster.num_workers=2", "cluster.compute_ms=5"]
    if runtime == "sim":
        setup = ["runtime=sim", "cluster.num_workers=4"]
    args = [*RUN, "dataset.dir=data", *setup, *budget, "eval.every_updates=100"]
    return [*args, "algorithm=ssp", f"hydra.run.dir={run_dir}"]


def sweeping(sweep: Path) -> list[str]:
    """The arguments of test_a_sweep_on_it_writes_its_report's sweep."""
    args = ["-m", *RUN, "dataset.dir=data", "runtime=sim", "cluster.num_workers=4"]
    args += ["algorithm=asp,ssp", "seed=0", "budget.max_updates=150"]
    args += ["budget.max_wall_s=0", "eval.every_s=0", "eval.every_updates=50"]
    return [*args, f"hydra.sweep.dir={sweep}"]


@pytest.fixture(scope="module")
def ran(installed, driver) -> dict[str, dict]:
    """Every `stalebench` command of this file, run once in the example's folder (with the
    generator's data/): case id -> the case, its exit code, stdout and stderr."""
    env, tmp = installed
    cases = [  # the longest first: two at a time, the short ones fill in
        *[case(f"train-{r}", tmp, training(r, tmp / f"run-{r}"), limit=180) for r in RUNTIMES],
        case("sweep", tmp, sweeping(tmp / "sweep"), limit=180),
        case("list-dataset", tmp, ["list", "dataset"], limit=180),
        case("list-model", tmp, ["list", "model"], limit=180),
        *[
            case(f"bad-{override}", tmp, [*RUN, "dataset.dir=data", override,
                                          f"hydra.run.dir={refused(tmp, override)}"], limit=180)
            for override, _ in BAD
        ],
    ]  # fmt: skip
    return driver.run(cases, at_once=2)


def refused(tmp: Path, override: str) -> Path:
    """The run directory a bad input's command is given (one each: they may run at once)."""
    return tmp / f"refused-{[o for o, _ in BAD].index(override)}"


def succeeded(done: dict) -> dict:
    assert done["code"] == 0, f"{done['args']}\n{done['stdout'][-3000:]}\n{done['stderr'][-3000:]}"
    return done


def test_the_generator_writes_a_table_in_the_format_the_dataset_reads(installed):
    _, tmp = installed
    for split, rows in (("train", 3000), ("test", 600)):
        lines = (tmp / "data" / f"{split}.csv").read_text().splitlines()
        assert lines[0] == "x1,x2,label" and len(lines) == rows + 1
        assert {line.rsplit(",", 1)[1] for line in lines[1:]} == {"0", "1", "2"}


def test_the_plugin_is_listed_beside_the_built_ins(ran):
    datasets = succeeded(ran["list-dataset"])["stdout"]
    assert "  csv " in datasets and "  mnist1d " in datasets
    assert "  resmlp " in succeeded(ran["list-model"])["stdout"]


@pytest.mark.parametrize("override, said", BAD)
def test_bad_input_is_refused_by_name_before_anything_starts(installed, ran, override, said):
    _, tmp = installed
    done = ran[f"bad-{override}"]
    assert done["code"] == 2, f"{done['stdout'][-3000:]}\n{done['stderr'][-3000:]}"
    assert done["stderr"].startswith(said), done["stderr"]
    assert not (refused(tmp, override) / "events.jsonl").exists()


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_it_trains_in_both_runtimes(installed, ran, runtime):
    _, tmp = installed
    run_dir = tmp / f"run-{runtime}"
    succeeded(ran[f"train-{runtime}"])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["runtime"]) == ("completed", runtime)
    assert (summary["dataset"], summary["model"], summary["updates"]) == ("csv", "resmlp", 300)
    tests = [e for e in read_events(run_dir / "events.jsonl") if e.get("split") == "test"]
    assert tests[-1]["loss"] < tests[0]["loss"]  # it learns from the table
    assert summary["final"]["accuracy"] > summary["chance_accuracy"] + 0.1


def test_a_sweep_on_it_writes_its_report(installed, ran):
    _, tmp = installed
    sweep = tmp / "sweep"
    succeeded(ran["sweep"])
    report = (sweep / "report.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith(("| asp |", "| ssp |"))]
    assert len(rows) == 2, report[:2000]
    assert all(json.loads(p.read_text())["dataset"] == "csv" for p in sweep.glob("*/summary.json"))
