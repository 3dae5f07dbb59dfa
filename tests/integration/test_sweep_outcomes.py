"""A sweep finishes whatever its jobs do: one with bad input is recorded `invalid` and the
sweep goes on, one that fails and one that diverges end with their statuses, the report
lists all 20, and the exit code says a job measured nothing. Rerun with `resume=true` into
the same sweep directory, it trains nothing that completed. Arms are a config group in a
directory of the test's own, the way a paper's sweep composes its arms.

Each `stalebench` command is a process forked by a driver that imported the CLI once
(tests/cli_driver.py's `Command`)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.cli_driver import SWEEP_IMPORTS, Command
from tests.integration.test_cli import FAST

pytestmark = pytest.mark.slow

SPECIAL = {
    "invalid": "algorithm:\n  update:\n    lr: -1\n",
    "fails": "cluster:\n  faults:\n    - {worker: 1, at_s: 0.01, action: die}\n",
    "diverges": "algorithm:\n  update:\n    lr: 1000000.0\n",
}


def arms(root: Path) -> Path:
    folder = root / "conf" / "arm"
    folder.mkdir(parents=True)
    for seed in range(17):
        (folder / f"ok{seed:02d}.yaml").write_text(f"# @package _global_\nseed: {seed}\n")
    for name, body in SPECIAL.items():
        (folder / f"{name}.yaml").write_text("# @package _global_\n" + body)
    return root / "conf"


ARMS = ",".join([*(f"ok{s:02d}" for s in range(17)), *SPECIAL])


def sweep(command: Command, tmp_path: Path, conf: Path, *extra: str):
    args = [
        "-m",
        f"hydra.searchpath=[file://{conf}]",
        f"+arm={ARMS}",
        "runtime=sim",
        "budget.max_updates=30",
        "hydra.sweep.dir=sweep",
        *FAST[:-1],
        *extra,
    ]
    return command(args, tmp_path, timeout=290)


@pytest.fixture
def command(tmp_path_factory):
    with Command(tmp_path_factory.mktemp("driver"), imports=SWEEP_IMPORTS) as command:
        yield command


def jobs(sweep_dir: Path) -> dict[str, Path]:
    """Each arm's job directory (Hydra numbers them; its overrides.yaml names the arm)."""
    out = {}
    for overrides in sweep_dir.glob("*/.hydra/overrides.yaml"):
        arm = next(o for o in overrides.read_text().split() if o.startswith("+arm="))
        out[arm.removeprefix("+arm=")] = overrides.parent.parent
    return out


def statuses(sweep_dir: Path) -> dict[str, str]:
    return {
        arm: json.loads((job / "summary.json").read_text())["status"]
        for arm, job in jobs(sweep_dir).items()
    }


def stamps(sweep_dir: Path) -> dict[str, tuple[int, int]]:
    """Each job's events.jsonl and summary.json: modification times (ns)."""
    return {
        arm: ((job / "events.jsonl").stat().st_mtime_ns, (job / "summary.json").stat().st_mtime_ns)
        for arm, job in jobs(sweep_dir).items()
        if (job / "events.jsonl").exists()
    }


@pytest.mark.timeout(600)
def test_a_sweep_with_bad_failing_and_diverging_jobs_completes_the_rest(command, tmp_path):
    conf = arms(tmp_path)
    done = sweep(command, tmp_path, conf)
    sweep_dir = tmp_path / "sweep"
    assert done.returncode == 1, done.stderr[-3000:]  # not every job measured something
    assert "algorithm.update.lr must be > 0, got -1.0" in done.stderr
    expected = {f"ok{s:02d}": "completed" for s in range(17)} | {
        "invalid": "invalid",
        "fails": "failed",
        "diverges": "diverged",
    }
    assert statuses(sweep_dir) == expected
    invalid = json.loads((jobs(sweep_dir)["invalid"] / "summary.json").read_text())
    assert invalid["error"] == "algorithm.update.lr must be > 0, got -1.0"
    assert (invalid["algorithm"], invalid["num_workers"], invalid["seed"]) == ("ssp", 4, 0)

    with open(sweep_dir / "tables" / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["status"] for r in rows) == sorted(expected.values())  # all 20 listed
    report = (sweep_dir / "report.md").read_text()
    assert "Runs: 20 (17 completed)" in report
    for name, status in (("invalid", "invalid"), ("fails", "failed"), ("diverges", "diverged")):
        assert f"{jobs(sweep_dir)[name]}` — ssp, seed 0: **{status}**" in report, report

    before = stamps(sweep_dir)
    again = sweep(command, tmp_path, conf, "resume=true")
    assert again.returncode == 1, again.stderr[-3000:]
    assert statuses(sweep_dir) == expected
    after = stamps(sweep_dir)
    for name in expected:
        if expected[name] == "completed":  # kept: nothing trained, nothing written
            assert after[name] == before[name], name
        elif name != "invalid":  # run again from the start: one run in the events
            assert after[name] > before[name], name
            events = (jobs(sweep_dir)[name] / "events.jsonl").read_text()
            assert events.count('"event": "start"') == 1, name
    assert again.stdout.count("[kept] resume=true") == 17
