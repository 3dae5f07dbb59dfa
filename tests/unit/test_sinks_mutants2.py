"""The event tail's thread and the W&B sink's and log_verdicts' W&B runs, offline and read
back from disk: the project, one run per call even while another run is still open, no
console output, the 60 s start timeout, the run's time as every metric's x-axis, a window
without a loss, the per-worker table's columns and a verdict with missing fields.

Complements test_sinks_mutants.py and test_wandb_sink.py: each test here pins behaviour
that a surviving mutant of stalebench/metrics/sinks.py changed without a test noticing.
Expected values are written by hand."""

from __future__ import annotations

import json

import pytest

from stalebench.metrics.sinks import EventTail, Wandb, log_verdicts
from tests.wandb_log import read_run, records, rows, run_file

pytestmark = pytest.mark.usefixtures("wandb_home")


def sink(run_dir, name="asp-seed0", project="stalebench"):
    return Wandb(
        project=project, mode="offline", run_dir=run_dir, name=name, group=None,
        job_type="asp", config={"seed": 0, "runtime": "real"},
    )  # fmt: skip


def update(version, t, loss, lag=0, worker=0):
    return dict(
        kind="update", t=t, worker=worker, clock=version - 1, version=version, lag=lag,
        loss=loss, compute_s=0.5, wait_s=0.25, comm_s=0.125, clock_gap=0,
    )  # fmt: skip


def history(run_dir) -> list[dict]:
    return rows(read_run(run_file(run_dir)))


def metric_definitions(run_dir) -> list[tuple[str, str, str]]:
    """(name, glob, step metric) of each metric record in the run, in order."""
    out = []
    for record in records(run_file(run_dir)):
        if record.WhichOneof("record_type") == "metric":
            m = record.metric
            out.append((m.name, m.glob_name, m.step_metric))
    return out


def debug_log(run_dir) -> str:
    (path,) = run_dir.glob("wandb/offline-run-*/logs/debug.log")
    return path.read_text()


# --- EventTail ------------------------------------------------------------------------------


def test_the_tail_is_a_daemon_thread_that_polls_every_half_second_by_default(tmp_path):
    # the CLI builds it as EventTail(path, sinks): a daemon (an unclosed tail never keeps the
    # process alive) that hands lines over every 0.5 s, the progress line's default refresh
    tail = EventTail(tmp_path / "events.jsonl", [])
    assert (tail.daemon, tail.name, tail.poll_s) == (True, "event-tail", 0.5)


# --- Wandb ----------------------------------------------------------------------------------


def test_the_sinks_run_is_in_the_given_project(tmp_path):
    s = sink(tmp_path / "run", project="staleness-study")
    s.close(None)
    assert read_run(run_file(tmp_path / "run"))["run"].project == "staleness-study"


def test_the_sinks_run_writes_nothing_to_the_console(tmp_path, capfd):
    run_dir = tmp_path / "run"
    run_dir.mkdir()  # as in the CLI: the run directory exists before the sink starts
    s = sink(run_dir)
    for i in range(3):
        s.on_event(update(i + 1, 0.25 * i, 1.0))
    s.close({"status": "completed"})
    assert capfd.readouterr() == ("", "")


def test_the_sink_gives_wandb_60_s_to_start(tmp_path):
    sink(tmp_path / "run").close(None)
    assert "communicating run to backend with 60.0 second timeout" in debug_log(tmp_path / "run")


def test_a_new_sink_finishes_a_run_left_open_and_logs_to_its_own_run(tmp_path):
    # a sink switched off by the tail is never closed, so its run stays open; the next job
    # of a multirun must still get a W&B run of its own
    left_open = sink(tmp_path / "job0", name="asp-seed0")
    second = sink(tmp_path / "job1", name="asp-seed1")
    try:
        second.on_event(update(1, 0.0, 2.0))
        second.on_event(update(2, 0.5, 1.0))
    finally:
        second.close({"status": "completed"})
        left_open.run.finish()
    assert read_run(run_file(tmp_path / "job1"))["run"].display_name == "asp-seed1"
    assert history(tmp_path / "job1")[0] == {
        "time/real_s": 0.5, "train/batch_loss": 1.5, "sys/lag": 0.0, "sys/updates": 2,
    }  # fmt: skip
    assert read_run(run_file(tmp_path / "job0"))["run"].display_name == "asp-seed0"
    assert history(tmp_path / "job0") == []  # nothing of the second job in the first


def test_the_runs_time_is_defined_as_the_x_axis_of_every_metric(tmp_path):
    s = sink(tmp_path / "run")
    s.on_event(update(1, 0.0, 2.0))
    s.on_event(update(2, 0.25, 1.0))  # 0.25 s after the first: the window stays open
    s.close(None)
    # time/real_s itself first (so the glob does not make it its own step metric), then every
    # other metric against it
    assert metric_definitions(tmp_path / "run") == [
        ("time/real_s", "", ""),
        ("", "*", "time/real_s"),
    ]
    # so the histogram and the table, logged without a time, sit at the last time logged:
    # the window flushed by close (0.25), not at no time at all
    assert [row.get("time/real_s") for row in history(tmp_path / "run")] == [0.25, 0.25, 0.25]


def test_a_window_without_any_loss_logs_a_null_batch_loss(tmp_path):
    s = sink(tmp_path / "run")
    # every update diverged (null loss): the window (t 0, 0.25, 0.5) still logs lag and updates
    s.on_event(update(1, 0.0, None, lag=1))
    s.on_event(update(2, 0.25, None, lag=2))
    s.on_event(update(3, 0.5, None, lag=3))
    s.close(None)
    assert history(tmp_path / "run")[0] == {
        "time/real_s": 0.5, "train/batch_loss": None, "sys/lag": 2.0, "sys/updates": 3,
    }  # fmt: skip


def test_the_per_worker_table_has_the_worker_and_its_three_times_as_columns(tmp_path):
    s = sink(tmp_path / "run")
    s.on_event(update(1, 0.0, 1.0, worker=1))
    s.close(None)
    (saved,) = (tmp_path / "run").glob("wandb/offline-run-*/files/media/table/workers/*.json")
    table = json.loads(saved.read_text())
    assert table["columns"] == ["worker", "compute_s", "wait_s", "comm_s"]
    assert table["data"] == [[1, 0.5, 0.25, 0.125]]


# --- log_verdicts ---------------------------------------------------------------------------

VERDICT = dict(id="C1", scope="", text="a", metric="m", published=1.5, ours=1.25,
               verdict="holds", notes="")  # fmt: skip


def test_the_verdicts_run_is_in_the_given_project(tmp_path):
    out = tmp_path / "sweep-1"
    log_verdicts([VERDICT], project="staleness-study", mode="offline", group="g", out_dir=out)
    assert read_run(run_file(out))["run"].project == "staleness-study"


def test_logging_verdicts_writes_nothing_to_the_console(tmp_path, capfd):
    out = tmp_path / "sweep-1"
    out.mkdir()  # as in the Hydra callback: the sweep directory exists
    log_verdicts([VERDICT], project="stalebench", mode="offline", group="g", out_dir=out)
    assert capfd.readouterr() == ("", "")


def test_logging_verdicts_gives_wandb_60_s_to_start(tmp_path):
    out = tmp_path / "sweep-1"
    log_verdicts([VERDICT], project="stalebench", mode="offline", group="g", out_dir=out)
    assert "communicating run to backend with 60.0 second timeout" in debug_log(out)


def test_verdicts_go_to_their_own_run_while_another_run_is_open(tmp_path):
    left_open = sink(tmp_path / "job0", name="asp-seed0")
    out = tmp_path / "sweep-1"
    try:
        log_verdicts([VERDICT], project="stalebench", mode="offline", group="g", out_dir=out)
    finally:
        left_open.run.finish()
    run = read_run(run_file(out))
    assert (run["run"].display_name, run["run"].job_type) == ("claims-sweep-1", "claims")
    assert run["summary"]["verdict/C1"] == "holds"
    assert history(tmp_path / "job0") == []  # no claims table in the open run


def test_a_verdict_without_some_fields_shows_them_as_empty_cells(tmp_path):
    out = tmp_path / "sweep-1"
    sparse = dict(id="C2", scope="mnist", verdict="not run")  # no text, metric, ..., notes
    log_verdicts([sparse], project="stalebench", mode="offline", group="g", out_dir=out)
    (saved,) = out.glob("wandb/offline-run-*/files/media/table/claims_*.table.json")
    assert json.loads(saved.read_text())["data"] == [["C2", "mnist", "", "", "", "", "not run", ""]]
