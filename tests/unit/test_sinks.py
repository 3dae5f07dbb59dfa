"""The event tail and the progress line, on a real events.jsonl written as a run would."""

import io
import math

from stalebench.metrics.events import EventLog
from stalebench.metrics.sinks import EventTail, Progress, Sink


class Terminal(io.StringIO):
    def isatty(self):
        return True


class Collect(Sink):
    def __init__(self):
        self.events, self.closed = [], None

    def on_event(self, event):
        self.events.append(event)

    def close(self, summary):
        self.closed = summary


class Broken(Sink):
    def on_event(self, event):
        raise RuntimeError("boom")


def test_tail_hands_over_every_event_once_and_survives_a_broken_sink(tmp_path):
    path = tmp_path / "events.jsonl"
    collect, broken = Collect(), Broken()
    tail = EventTail(path, [broken, collect], poll_s=0.01)
    tail.start()
    log = EventLog(path)
    for v in range(1, 6):
        log.emit(
            "update",
            v * 0.1,
            worker=0,
            clock=v - 1,
            version=v,
            lag=1,
            loss=1.0 / v,
            compute_s=0.1,
            wait_s=0.0,
            comm_s=0.0,
        )
    with open(path, "a") as f:
        f.write('{"kind": "upd')  # a torn line: must wait, not break
    tail.close({"status": "completed"})
    log.close()
    assert [e["version"] for e in collect.events] == [1, 2, 3, 4, 5]
    assert collect.closed == {"status": "completed"}
    assert broken not in tail.sinks


def test_progress_line_on_a_terminal_and_silence_elsewhere():
    term = Terminal()
    p = Progress("ssp", max_updates=100, max_wall_s=20.0, stream=term, every_s=0.0)
    for v in range(1, 11):
        p.on_event({"kind": "update", "t": v * 0.5, "version": v, "loss": 2.0, "lag": 3})
    p.close(None)
    last = term.getvalue().strip().split("\r")[-1]
    assert last.startswith("[ssp] 10 updates (2/s) loss 2.000 lag 3.0 t 5.0 s")
    assert "10/100 updates" in last and "15.0 s left" in last
    quiet = io.StringIO()
    q = Progress("ssp", 100, 20.0, stream=quiet)
    q.on_event({"kind": "update", "t": 1.0, "version": 1, "loss": 2.0, "lag": 0})
    q.close(None)
    assert quiet.getvalue() == ""


def test_a_log_that_keeps_its_events_keeps_them_as_they_are_read_back(tmp_path):
    # what the simulator's run end takes instead of parsing events.jsonl again: every event
    # as `read_events` gives it, a NaN as null, a tuple as a list, a nested dict as written
    from stalebench.metrics.events import EventLog, read_events

    log = EventLog(tmp_path / "events.jsonl", keep=True)
    log.emit("update", 0.1234567, loss=1.5, worker=2, ok=True, note=None)
    log.emit("update", 0.2, loss=float("nan"), shape=(1, 2), extra={"a": [1.0, 2]})
    # a round's events in one write: each row an event, a NaN among them as null
    log.emit_all("update", 0.3, [{"worker": 0, "loss": 1.0}, {"worker": 1, "loss": math.inf}])
    log.close()
    assert log.kept == read_events(tmp_path / "events.jsonl")
    assert log.kept[1]["loss"] is None and log.kept[1]["shape"] == [1, 2]
    rows = [(e["t"], e["worker"], e["loss"]) for e in log.kept[2:]]
    assert rows == [(0.3, 0, 1.0), (0.3, 1, None)]
    # a file that holds something already: nothing is kept (it is not all this log's)
    again = EventLog(tmp_path / "events.jsonl", keep=True)
    assert again.kept is None
    again.close()
