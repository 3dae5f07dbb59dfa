"""The progress line's exact text and the event tail's reading of a growing events.jsonl,
as the CLI wires them (EventTail -> [Progress, ...]); expected values computed by hand.

Complements test_sinks.py: each test here pins behaviour that a surviving mutant of
stalebench/metrics/sinks.py changed without a test noticing."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import stalebench
from stalebench.metrics.events import EventLog, read_events
from stalebench.metrics.sinks import EventTail, Progress, Sink

ROOT = Path(stalebench.__file__).resolve().parents[1]  # the stalebench this test imports
DEADLINE_S = 5.0  # bound on every wait for the tail thread: a tail that stalls fails, never hangs


class Terminal(io.StringIO):
    def isatty(self):
        return True


class Collect(Sink):
    """Records each event it is handed, with the thread that handed it over."""

    def __init__(self):
        self.events, self.threads, self.closed = [], [], None
        self._cond = threading.Condition()

    def on_event(self, event):
        with self._cond:
            self.events.append(event)
            self.threads.append(threading.current_thread().name)
            self._cond.notify_all()

    def close(self, summary):
        self.closed = summary

    def versions(self):
        with self._cond:
            return [e.get("version") for e in self.events]

    def wait_for(self, n, timeout=DEADLINE_S):
        """True once at least n events arrived, False after `timeout` seconds."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self.events) >= n, timeout=timeout)


class BrokenOnEvent(Sink):
    def on_event(self, event):
        raise RuntimeError("boom")


class BrokenClose(Sink):
    def close(self, summary):
        raise ValueError("no close")


def update(log, v, t, loss, lag):
    log.emit(
        "update", t, worker=0, clock=v - 1, version=v, lag=lag, loss=loss,
        compute_s=0.01, wait_s=0.0, comm_s=0.0,
    )  # fmt: skip


def line_of(v):
    return json.dumps({"kind": "update", "t": v * 0.1, "version": v, "lag": 0}) + "\n"


# --- Progress -------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_progress_exact_lines_through_the_tail(tmp_path):
    """Default every_s=0.5, budget 100 updates / 10 s, events fed the CLI's way."""
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    update(log, 1, 0.0, None, 3)  # shown: 0.0-(-1.0)=1.0 >= 0.5; t=0 -> rate 0; no loss yet
    update(log, 2, 0.25, 2.0, 1)  # hidden: 0.25-0.0 < 0.5; first loss -> 2.0 as is
    update(log, 5, 0.5, 1.0, 2)  # shown: 0.5-0.0 = 0.5 >= 0.5 (exactly)
    log.emit("eval", 0.6, version=5, split="val", loss=1.5, accuracy=0.4)  # not an update
    update(log, 48, 9.6, None, 4)  # shown; a diverged (null) loss leaves the EMA alone
    update(log, 60, 12.0, 0.9, 0)  # shown; past the wall budget
    log.close()
    term = Terminal()
    tail = EventTail(path, [Progress("ssp", 100, 10.0, stream=term)], poll_s=0.01)
    tail.start()
    tail.close({"status": "completed"})
    lines = [
        # rate: t=0 -> 0; lag 3/1; left 10-0
        "[ssp] 1 updates (0/s) loss — lag 3.0 t 0.0 s | 1/100 updates, 10.0 s left",
        # loss 0.9*2.0+0.1*1.0=1.9; lag (3+1+2)/3=2.0; rate 5/0.5=10; left 10-0.5=9.5
        "[ssp] 5 updates (10/s) loss 1.900 lag 2.0 t 0.5 s | 5/100 updates, 9.5 s left",
        # loss stays 1.9; lag (6+4)/4=2.5; rate 48/9.6=5; left 10-9.6=0.4
        "[ssp] 48 updates (5/s) loss 1.900 lag 2.5 t 9.6 s | 48/100 updates, 0.4 s left",
        # loss 0.9*1.9+0.1*0.9=1.71+0.09=1.8; lag (10+0)/5=2.0; rate 60/12=5; left max(-2,0)
        "[ssp] 60 updates (5/s) loss 1.800 lag 2.0 t 12.0 s | 60/100 updates, 0.0 s left",
    ]
    # each shown line overwrites the last (\r), one newline at the end
    assert term.getvalue() == "".join("\r" + x for x in lines) + "\n"


def test_progress_draws_the_first_update_whatever_every_s_is():
    # every_s = 1.5 and a first update at t = 0.2: drawn at once (it waited until
    # t >= every_s - 1 when the last-drawn time started at -1 instead of -inf)
    term = Terminal()
    p = Progress("x", 0, 0.0, stream=term, every_s=1.5)
    p.on_event({"kind": "update", "t": 0.2, "version": 1, "loss": 1.0, "lag": 0})
    assert term.getvalue() == "\r[x] 1 updates (5/s) loss 1.000 lag 0.0 t 0.2 s | "
    p.on_event({"kind": "update", "t": 1.6, "version": 2, "loss": 1.0, "lag": 0})
    assert term.getvalue().count("\r") == 1  # 1.6 − 0.2 < 1.5: not drawn again yet


def test_progress_line_before_the_first_update():
    p = Progress("asp", 100, 10.0, stream=Terminal())
    # nothing yet: 0 updates, t 0 -> rate 0, no loss, lag 0/max(0,1)=0.0, all 10 s left
    assert p.line() == "[asp] 0 updates (0/s) loss — lag 0.0 t 0.0 s | 0/100 updates, 10.0 s left"


def test_progress_newline_on_close_only_after_a_shown_line():
    def upd(t):
        return {"kind": "update", "t": t, "version": 1, "loss": 1.0, "lag": 0}

    # one update at t=0.0: the first update is always shown; _shown=0.0 counts as shown
    term = Terminal()
    p = Progress("x", 0, 0.0, stream=term)  # no budget: nothing after the "|"
    p.on_event(upd(0.0))
    p.close(None)
    assert term.getvalue() == "\r[x] 1 updates (0/s) loss 1.000 lag 0.0 t 0.0 s | \n"
    # one update at t=0.5: shown; rate 1/0.5=2
    term = Terminal()
    p = Progress("x", 0, 0.0, stream=term)
    p.on_event(upd(0.5))
    p.close(None)
    assert term.getvalue() == "\r[x] 1 updates (2/s) loss 1.000 lag 0.0 t 0.5 s | \n"
    # no update at all: no line was drawn, so close writes nothing (not even a newline)
    term = Terminal()
    p = Progress("x", 100, 10.0, stream=term)
    p.on_event({"kind": "eval", "t": 0.5, "version": 0, "split": "val", "loss": 2.0})
    p.close({"status": "completed"})
    assert term.getvalue() == ""


def test_progress_says_what_it_waits_for_before_the_first_update():
    term = Terminal()
    p = Progress("ssp", 100, 10.0, stream=term)
    p.say("preparing data and model …")
    p.on_event({"kind": "system", "t": 0.0, "event": "start"})
    p.on_event({"kind": "update", "t": 0.5, "version": 1, "loss": 1.0, "lag": 0})
    p.close(None)
    first = "[ssp] preparing data and model …"
    second = "[ssp] started; waiting for the first update …"
    third = "[ssp] 1 updates (2/s) loss 1.000 lag 0.0 t 0.5 s | 1/100 updates, 9.5 s left"
    # each overwrites the last, padded over a longer one; one newline at the end
    assert term.getvalue() == (
        f"\r{first}\r{second}\r{third}"
        + " " * (len(second) - len(third)) * (len(second) > len(third))
        + "\n"
    )


# --- EventTail ------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_tail_follows_the_file_while_it_grows_each_event_once_in_its_thread(tmp_path):
    path = tmp_path / "events.jsonl"
    collect = Collect()
    tail = EventTail(path, [collect], poll_s=0.01)
    tail.start()  # before the file exists: the tail waits for it
    log = EventLog(path)
    update(log, 1, 0.1, 1.0, 0)
    update(log, 2, 0.2, 1.0, 0)
    assert collect.wait_for(2), "events not delivered while the run goes (before close)"
    # a complete line and the first half of the next one, appended in one write
    v4 = line_of(4)
    with open(path, "a") as f:
        f.write(line_of(3) + v4[:15])
    assert collect.wait_for(3), "event 3 not delivered"
    assert collect.versions()[:3] == [1, 2, 3]  # nothing re-read, the torn line held back
    with open(path, "a") as f:
        f.write(v4[15:])  # the line is complete now
    assert collect.wait_for(4), "a line completed by a later write was never delivered"
    update(log, 5, 0.5, 1.0, 0)
    log.close()
    tail.close({"status": "completed"})  # stops following and drains what is left
    assert collect.versions() == [1, 2, 3, 4, 5]
    assert collect.threads[:4] == ["event-tail"] * 4  # the tail's own, named thread
    assert collect.closed == {"status": "completed"}
    assert not tail.is_alive()


@pytest.mark.timeout(30)
def test_tail_skips_a_bad_line_and_goes_on_as_reports_do(tmp_path):
    """A line that is no JSON (a writer killed mid-line, then appended to) is skipped and
    the lines after it still reach the sinks: the same events read_events gives reports."""
    path = tmp_path / "events.jsonl"
    path.write_text(line_of(1) + '{"kind": "upd\n' + "\n" + line_of(2) + line_of(3))
    collect = Collect()
    tail = EventTail(path, [collect], poll_s=0.01)
    tail.start()
    tail.close(None)
    assert collect.versions() == [1, 2, 3]
    assert collect.events == read_events(path)


@pytest.mark.timeout(30)
def test_a_failing_sink_is_switched_off_with_one_warning_and_the_rest_carry_on(
    tmp_path, capsys, caplog
):
    path = tmp_path / "events.jsonl"
    path.write_text(line_of(1))
    broken_event, broken_close, collect = BrokenOnEvent(), BrokenClose(), Collect()
    with caplog.at_level(logging.WARNING, logger="stalebench"):
        tail = EventTail(path, [broken_event, broken_close, collect], poll_s=0.01)
        tail.start()
        assert collect.wait_for(1)  # BrokenOnEvent came first and failed, in the thread
        tail.close({"status": "completed"})  # BrokenClose fails here: close must not raise
    assert collect.closed == {"status": "completed"}  # closed although one before it failed
    assert tail.sinks == [collect]
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "stalebench: warning: BrokenOnEvent switched off: boom\n"
        "stalebench: warning: BrokenClose switched off: no close\n"
    )
    records = [r for r in caplog.records if r.name == "stalebench"]
    assert [(r.levelname, r.getMessage()) for r in records] == [
        ("WARNING", "BrokenOnEvent switched off: boom"),
        ("WARNING", "BrokenClose switched off: no close"),
    ]
    assert records[0].threadName == "event-tail"


@pytest.mark.timeout(30)
def test_an_unclosed_tail_never_keeps_the_process_alive(tmp_path):
    """A run whose main thread ends without closing the tail still exits (daemon thread)."""
    code = (
        "import sys\n"
        "from stalebench.metrics.sinks import EventTail\n"
        "EventTail(sys.argv[1], [], poll_s=0.01).start()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "events.jsonl")],
        env=env, capture_output=True, text=True, timeout=10,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
