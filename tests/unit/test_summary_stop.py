"""summary.stop: how a run its writers did not end gets its last event and its files —
buffered events written out first, a torn last line kept apart, the stop event at the time
of the last event, summary.json with the status and the reason. Expected values by hand."""

from __future__ import annotations

import json

import pandas as pd

from stalebench.metrics.events import EventLog, read_events
from stalebench.metrics.summary import stop
from tests.unit.test_summary import META, update


def lines(path):
    return path.read_text().split("\n")


def test_stop_after_complete_lines(tmp_path):
    written = [
        {"kind": "system", "t": 0.0, "event": "start"},
        update(2.5, 1, 1, 2, 1, 0.5, 1),  # the latest event is not the last line
        update(1.25, 0, 1, 1, 0, 0.5, 0),
    ]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in written))

    s = stop(tmp_path, META, "interrupted", "SIGTERM", target_accuracy=0.9)

    raw = lines(tmp_path / "events.jsonl")
    assert raw[-1] == ""  # the file ends with a newline, no blank line before the stop event
    assert len(raw) == 5 and all(raw[:4])
    last = json.loads(raw[3])
    assert last == {
        "kind": "system",
        "t": 2.5,  # the latest event's time, not the time stop() ran
        "event": "stop",
        "status": "interrupted",
        "reason": "SIGTERM",
    }
    assert s["status"] == "interrupted" and s["error"] == "SIGTERM"
    assert s["updates"] == 2 and s["run_time_s"] == 2.5
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["status"] == "interrupted" and on_disk["error"] == "SIGTERM"
    table = pd.read_parquet(tmp_path / "metrics.parquet")
    assert list(table["kind"]) == ["system", "update", "update", "system"]
    assert list(table["event"].iloc[[0, 3]]) == ["start", "stop"]


def test_stop_writes_out_a_buffered_log_of_this_process(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog(path, flush_s=3600.0)  # nothing reaches the disk for an hour
    log.emit("system", 0.0, event="start")
    log.emit("eval", 7.0, version=0, split="test", loss=2.0, accuracy=0.25)
    assert path.read_text() == ""

    s = stop(tmp_path, META, "timeout", "budget.max_wall_s=5 passed", target_accuracy=0.2)

    events = read_events(path)
    assert [e["kind"] for e in events] == ["system", "eval", "system"]
    assert events[-1]["t"] == 7.0 and events[-1]["reason"] == "budget.max_wall_s=5 passed"
    assert s["status"] == "timeout" and s["time_to_target_s"] == 7.0
    log.close()


def test_stop_keeps_a_torn_last_line_apart(tmp_path):
    path = tmp_path / "events.jsonl"
    whole = json.dumps({"kind": "system", "t": 3.0, "event": "start"})
    path.write_text(whole + "\n" + '{"kind": "update", "t": 9.0, "wor')  # a writer killed

    stop(tmp_path, META, "failed", "worker 1 (rank 2) lost", target_accuracy=0.9)

    raw = lines(path)
    assert raw[0] == whole
    assert raw[1] == '{"kind": "update", "t": 9.0, "wor'  # left as it was, on its own line
    stopped = json.loads(raw[2])
    assert stopped["event"] == "stop" and stopped["t"] == 3.0 and stopped["status"] == "failed"
    assert raw[3:] == [""]
    assert [e.get("event") for e in read_events(path)] == ["start", "stop"]


def test_stop_of_a_run_that_wrote_nothing(tmp_path):
    s = stop(tmp_path, META, "interrupted", "SIGINT", target_accuracy=0.9)
    (only,) = read_events(tmp_path / "events.jsonl")
    assert only == {
        "kind": "system",
        "t": 0.0,
        "event": "stop",
        "status": "interrupted",
        "reason": "SIGINT",
    }
    assert s["status"] == "interrupted" and s["updates"] == 0


def test_stop_of_an_empty_events_file(tmp_path):
    (tmp_path / "events.jsonl").write_text("")
    stop(tmp_path, META, "interrupted", None, target_accuracy=0.9)
    raw = lines(tmp_path / "events.jsonl")
    assert len(raw) == 2 and raw[1] == ""
    assert json.loads(raw[0])["reason"] is None


def test_an_interrupt_while_a_failed_run_winds_down_keeps_its_status(tmp_path):
    written = [
        {"kind": "system", "t": 0.0, "event": "start"},
        update(1.0, 0, 0, 1, 0, 0.5, 0),
        {"kind": "system", "t": 1.5, "event": "error", "error": "worker 1 (rank 2) lost"},
        {"kind": "system", "t": 1.5, "event": "end", "status": "failed", "updates": 1},
        {"kind": "eval", "t": 1.5, "version": 1, "split": "test", "loss": 1.0, "accuracy": 0.5},
    ]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in written))
    s = stop(tmp_path, META, "interrupted", "interrupted by SIGTERM", target_accuracy=0.9)
    assert s["status"] == "failed"
    assert s["error"] == "worker 1 (rank 2) lost; then interrupted by SIGTERM"
    last = read_events(tmp_path / "events.jsonl")[-1]
    assert (last["status"], last["reason"]) == ("failed", s["error"])


def test_an_interrupt_while_a_completed_run_is_evaluated_is_an_interrupt(tmp_path):
    # its evaluation did not finish: the summary says so, not completed
    written = [
        {"kind": "system", "t": 0.0, "event": "start"},
        {"kind": "system", "t": 2.0, "event": "end", "status": "completed", "updates": 0},
    ]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in written))
    s = stop(tmp_path, META, "interrupted", "interrupted by SIGINT", target_accuracy=0.9)
    assert (s["status"], s["error"]) == ("interrupted", "interrupted by SIGINT")


def test_a_diverged_run_without_an_error_event_keeps_the_interrupt_as_its_error(tmp_path):
    written = [{"kind": "system", "t": 3.0, "event": "end", "status": "diverged", "updates": 0}]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in written))
    s = stop(tmp_path, META, "interrupted", "interrupted by SIGINT", target_accuracy=0.9)
    assert (s["status"], s["error"]) == ("diverged", "interrupted by SIGINT")
    s = stop(tmp_path, META, "timeout", "the supervisor's deadline", target_accuracy=0.9)
    assert s["status"] == "timeout"  # only an interrupt defers to how the run ended
