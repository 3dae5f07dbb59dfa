"""The W&B sink in this process, offline, read back from its .wandb file: the run's
identity, each history row against values computed by hand from the events fed in, the
per-worker table and the summary; and a sweep's verdicts. (tests/integration/test_wandb.py
runs the same sink end to end through the CLI.)"""

from __future__ import annotations

import json

import pytest

from stalebench.metrics.sinks import Wandb, log_verdicts
from tests.wandb_log import read_run, run_file
from tests.wandb_log import rows as history

pytestmark = pytest.mark.usefixtures("wandb_home")


def update(i, worker, lag, loss):
    return dict(
        kind="update", t=0.25 * i, worker=worker, clock=i, version=i + 1, lag=lag, loss=loss,
        compute_s=0.5 * (worker + 1), wait_s=0.25, comm_s=0.125 * worker, clock_gap=0,
    )  # fmt: skip


def test_the_sink_logs_windows_evaluations_workers_and_the_summary(tmp_path):
    run_dir = tmp_path / "run"
    sink = Wandb(
        project="stalebench", mode="offline", run_dir=run_dir, name="ssp-0", group="g1",
        job_type="ssp", config={"algorithm": {"name": "ssp"}, "seed": 3, "runtime": "sim"},
    )  # fmt: skip
    # ten updates at t = 0, 0.25, ..., 2.25 from workers 0 and 1; worker 1 has no loss
    # at t = 1.0 (i = 4)
    for i in range(10):
        loss = None if i == 4 else float(i + 1)
        sink.on_event(update(i, worker=i % 2, lag=i % 4, loss=loss))
    sink.on_event(
        dict(kind="eval", t=2.5, split="test", loss=0.75, accuracy=0.5, version=10, worker=None)
    )
    sink.close({"status": "completed", "updates": 10, "host": "node-7", "clock": "simulated",
                "run_time_s": 2.5})  # fmt: skip

    run = read_run(run_file(run_dir))
    assert (run["run"].run_group, run["run"].job_type, run["run"].display_name) == (
        "g1",
        "ssp",
        "ssp-0",
    )
    config = {c.key: json.loads(c.value_json) for c in run["run"].config.update}
    assert config["algorithm"] == {"name": "ssp"} and config["seed"] == 3
    rows = history(run)
    # a window closes on the update 0.5 s after its first: (0, .25, .5), (.75, 1, 1.25),
    # (1.5, 1.75, 2); the eval flushes the rest (2.25) before it is logged
    assert rows[:5] == [
        {"time/simulated_s": 0.5, "train/batch_loss": 2.0, "sys/lag": 1.0, "sys/updates": 3},
        {"time/simulated_s": 1.25, "train/batch_loss": 5.0, "sys/lag": 4 / 3, "sys/updates": 6},
        {"time/simulated_s": 2.0, "train/batch_loss": 8.0, "sys/lag": 5 / 3, "sys/updates": 9},
        {"time/simulated_s": 2.25, "train/batch_loss": 10.0, "sys/lag": 1.0, "sys/updates": 10},
        {"time/simulated_s": 2.5, "test/loss": 0.75, "test/accuracy": 0.5, "sys/version": 10},
    ]
    # the lag histogram counts every update's lag: three 0s, three 1s, two 2s, two 3s
    hist = rows[5]
    assert hist["lag/histogram/_type"] == "histogram"
    values, bins = hist["lag/histogram/values"], hist["lag/histogram/bins"]
    assert (bins[0], bins[-1]) == (0, 3)
    assert [v for v in values if v] == [3, 3, 2, 2]
    # per-worker compute, wait and comm seconds, summed over each worker's five updates
    table = rows[6]
    assert table["workers/time/_type"] == "table-file" and table["workers/time/nrows"] == 2
    (saved,) = run_dir.glob("wandb/offline-run-*/files/media/table/workers/time_*.table.json")
    assert json.loads(saved.read_text())["data"] == [[0, 2.5, 1.25, 0.0], [1, 5.0, 1.25, 0.625]]
    summary = run["summary"]
    assert (summary["status"], summary["updates"]) == ("completed", 10)
    assert (summary["clock"], summary["run_time_s"]) == ("simulated", 2.5)
    assert "host" not in summary


@pytest.mark.parametrize(
    ("runtime", "key"),
    [("sim", "time/simulated_s"), ("real", "time/real_s"), (None, "time/s"), ("x", "time/s")],
)
def test_the_x_axis_names_the_runs_clock(tmp_path, runtime, key):
    # virtual seconds are never logged as if they were real ones: the key says which
    run_dir = tmp_path / "run"
    sink = Wandb(
        project="stalebench", mode="offline", run_dir=run_dir, name="n", group=None,
        job_type="asp", config={"runtime": runtime},
    )  # fmt: skip
    sink.on_event(dict(kind="eval", t=1.5, split="test", loss=0.5, accuracy=0.25, version=3))
    sink.close(None)
    first = history(read_run(run_file(run_dir)))[0]
    assert first == {key: 1.5, "test/loss": 0.5, "test/accuracy": 0.25, "sys/version": 3}


def test_a_run_with_no_updates_logs_no_window_and_no_histogram(tmp_path):
    run_dir = tmp_path / "run"
    sink = Wandb(
        project="stalebench", mode="offline", run_dir=run_dir, name="n", group=None,
        job_type="asp", config={},
    )  # fmt: skip
    sink.close(None)
    rows = history(read_run(run_file(run_dir)))
    assert len(rows) == 1 and rows[0]["workers/time/nrows"] == 0


def test_a_sweeps_verdicts_are_one_run_in_the_papers_group(tmp_path):
    out = tmp_path / "sweep-7"
    verdicts = [
        dict(id="C1", scope="", text="a", metric="m", published=1.5, ours=1.25, verdict="holds",
             notes=""),
        dict(id="C2", scope="mnist", text="b", metric="m", published=2, ours=None,
             verdict="inconclusive", notes="too few seeds"),
    ]  # fmt: skip
    log_verdicts(verdicts, project="stalebench", mode="offline", group="dssp", out_dir=out)
    run = read_run(run_file(out))
    assert (run["run"].run_group, run["run"].job_type, run["run"].display_name) == (
        "dssp",
        "claims",
        "claims-sweep-7",
    )
    verdict_keys = {k: v for k, v in run["summary"].items() if k.startswith("verdict/")}
    assert verdict_keys == {"verdict/C1": "holds", "verdict/C2[mnist]": "inconclusive"}
    (saved,) = out.glob("wandb/offline-run-*/files/media/table/claims_*.table.json")
    table = json.loads(saved.read_text())
    assert table["columns"] == [
        "id", "scope", "text", "metric", "published", "ours", "verdict", "notes"
    ]  # fmt: skip
    assert table["data"] == [
        ["C1", "", "a", "m", "1.5", "1.25", "holds", ""],
        ["C2", "mnist", "b", "m", "2", "None", "inconclusive", "too few seeds"],
    ]
