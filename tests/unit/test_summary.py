"""summary.json from hand-made events (expectations computed by hand), events.jsonl
round trip and schema, and finalize() writing summary.json and metrics.parquet."""

from __future__ import annotations

import json
import math

import pandas as pd
import pyarrow.parquet as pq
import pytest

from stalebench.metrics.events import EventLog, read_events, schema_errors
from stalebench.metrics.summary import finalize, summarize
from tests.conftest import SUMMARY_FIELDS

META = {
    "algorithm": "ssp",
    "parts": {"barrier": "ssp", "update": "sgd"},
    "barrier": "ssp",
    "update_rule": "sgd",
    "engine": "ps",
    "runtime": "real",
    "model": "mlp",
    "dataset": "synthetic",
    "cluster": "custom",
    "num_workers": 2,
    "seed": 3,
}


def update(t, worker, clock, version, lag, compute_s, clock_gap, loss=1.0):
    return {
        "kind": "update",
        "t": t,
        "worker": worker,
        "clock": clock,
        "version": version,
        "lag": lag,
        "loss": loss,
        "compute_s": compute_s,
        "wait_s": 0.1,
        "comm_s": 0.01,
        "clock_gap": clock_gap,
    }


def evaluation(t, version, split, accuracy, loss):
    return {
        "kind": "eval",
        "t": t,
        "version": version,
        "split": split,
        "loss": loss,
        "accuracy": accuracy,
    }


def make_events() -> list[dict]:
    return [
        {"kind": "system", "t": 0.0, "event": "start"},
        evaluation(0.5, 0, "train", 0.95, 0.1),  # train evals never count as test results
        update(1.0, 0, 1, 1, lag=0, compute_s=0.5, clock_gap=0, loss=2.0),
        update(1.5, 1, 1, 2, lag=1, compute_s=1.0, clock_gap=1),
        evaluation(1.0, 1, "test", 0.3, 1.5),
        update(2.0, 0, 2, 3, lag=1, compute_s=0.5, clock_gap=2),
        update(3.0, 1, 2, 4, lag=2, compute_s=1.0, clock_gap=1),
        update(3.5, 0, 3, 5, lag=4, compute_s=0.5, clock_gap=0),
        # listed out of time order: the summary orders test evals by t
        evaluation(4.0, 5, "test", 0.75, 0.6),
        evaluation(3.0, 4, "test", 0.8, 0.55),
        evaluation(2.0, 3, "test", 0.65, 0.9),
        evaluation(4.5, 5, "train", 0.99, 0.05),
        {"kind": "worker", "t": 4.2, "worker": 0, "event": "stop"},
        {"kind": "system", "t": 5.0, "event": "end", "bytes_sent": 12345},
    ]


def test_summarize_hand_computed():
    s = summarize(make_events(), META, "completed", None, target_accuracy=0.6)

    assert s["status"] == "completed" and s["error"] is None
    for key, value in META.items():
        assert s[key] == value
    assert s["run_time_s"] == 5.0  # t of the system end event
    assert s["clock"] == "real"  # META's runtime: its times are real seconds
    assert s["updates"] == 5  # the highest version
    assert s["gradients"] == 5
    # lags 0, 1, 1, 2, 4
    assert s["lag"]["mean"] == pytest.approx(1.6)
    assert s["lag"]["p50"] == pytest.approx(1.0)
    assert s["lag"]["p99"] == pytest.approx(2 + 0.96 * 2)  # linear interpolation
    assert s["lag"]["max"] == 4
    assert s["max_clock_gap"] == 2
    # worker 0 computes 1.5 s, worker 1 2.0 s, of 5 s: (0.3 + 0.4) / 2
    assert s["compute_fraction"] == pytest.approx(0.35)
    assert s["time_to_target_s"] == 2.0  # first test eval with accuracy >= 0.6
    assert s["final"] == {"loss": 0.6, "accuracy": 0.75}  # the last test eval
    assert s["best_accuracy"] == 0.8  # test split only
    assert s["target_accuracy"] == 0.6
    assert s["throughput_updates_per_s"] == pytest.approx(1.0)
    assert s["bytes_sent"] == 12345
    json.dumps(s, allow_nan=False)  # the summary is plain JSON


@pytest.mark.parametrize(
    ("runtime", "clock"), [("sim", "simulated"), ("real", "real"), (None, None), ("x", None)]
)
def test_a_runs_length_is_on_its_clock_and_never_called_wall_time(runtime, clock):
    # a simulated run's virtual seconds are not wall time: the key names neither, `clock`
    # says which they are (null for a runtime the summary does not know)
    meta = {**META, "runtime": runtime}
    s = summarize(make_events(), meta, "completed", None, 0.6)
    assert (s["clock"], s["run_time_s"], s["time_to_target_s"]) == (clock, 5.0, 2.0)
    assert "wall_time_s" not in s


def test_summarize_has_every_contract_field():
    s = summarize(make_events(), META, "completed", None, 0.6)
    assert SUMMARY_FIELDS <= s.keys()
    assert set(s["lag"]) == {"mean", "p50", "p99", "max"}


def test_summarize_target_exactly_reached_and_never_reached():
    events = make_events()
    assert summarize(events, META, "completed", None, 0.8)["time_to_target_s"] == 3.0
    assert summarize(events, META, "completed", None, 0.81)["time_to_target_s"] is None


def test_summarize_without_end_event_uses_last_update_time():
    events = [e for e in make_events() if e.get("event") != "end"]
    s = summarize(events, META, "failed", "worker 1 (rank 2) lost", 0.6)
    assert s["status"] == "failed" and s["error"] == "worker 1 (rank 2) lost"
    assert s["run_time_s"] == 3.5
    assert s["compute_fraction"] == pytest.approx((1.5 / 3.5 + 2.0 / 3.5) / 2)
    assert s["throughput_updates_per_s"] == pytest.approx(5 / 3.5)
    assert s["bytes_sent"] is None


def test_summarize_diverged_loss_and_accuracy_null():
    events = make_events()[:-1] + [
        evaluation(4.8, 6, "test", None, None),
        {"kind": "system", "t": 5.0, "event": "end", "bytes_sent": 1},
    ]
    s = summarize(events, META, "diverged", "loss is nan", 0.6)
    assert s["final"] == {"loss": None, "accuracy": None}
    assert s["best_accuracy"] == 0.8
    assert s["time_to_target_s"] == 2.0


def test_summarize_no_events():
    s = summarize([], META, "failed", "boom", 0.6)
    assert s["updates"] == 0 and s["gradients"] == 0
    assert s["final"] is None and s["best_accuracy"] is None
    assert s["time_to_target_s"] is None
    assert s["lag"] == {"mean": None, "p50": None, "p99": None, "max": None}
    assert s["compute_fraction"] is None and s["throughput_updates_per_s"] is None
    assert s["final_tail"] is None


def curve_events(accuracies, split="test"):
    """Evaluations at t = 1, 2, … with the given accuracies (loss 1 − accuracy, None kept),
    listed last first (the summary orders them by t), beside a train eval that never counts."""
    evals = [
        evaluation(float(i), i, split, a, None if a is None else 1.0 - a)
        for i, a in enumerate(accuracies, 1)
    ]
    return [{"kind": "system", "t": 0.0, "event": "start"}, *evals[::-1],
            evaluation(99.0, 99, "train", 0.0, 9.0)]  # fmt: skip


@pytest.mark.parametrize(
    ("n", "tail"),
    [(1, [0]), (9, [8]), (10, [9]), (19, [18]), (20, [18, 19]), (35, [32, 33, 34])],
)
def test_final_tail_is_the_mean_over_the_last_tenth_of_the_evaluations(n, tail):
    # accuracy 0.01 · i at the i-th evaluation (0-based), the last one dipping to 0.0
    accs = [0.01 * i for i in range(n - 1)] + [0.0]
    s = summarize(curve_events(accs), META, "completed", None, 0.5)
    mean = sum(accs[i] for i in tail) / len(tail)
    assert s["final_tail"] == {
        "loss": pytest.approx(1.0 - mean),
        "accuracy": pytest.approx(mean),
        "evals": len(tail),
    }
    assert s["final"] == {"loss": 1.0, "accuracy": 0.0}  # the last snapshot, as it was
    json.dumps(s, allow_nan=False)


def test_final_tail_reads_the_eval_split_of_the_headline_numbers():
    # a tuning run (eval.split=val): its val evaluations, never the train ones
    s = summarize(curve_events([0.5] * 18 + [0.6, 0.8], split="val"), META, "completed", None, 1)
    assert s["eval_split"] == "val"
    assert s["final_tail"] == {"loss": pytest.approx(0.3), "accuracy": 0.7, "evals": 2}


def test_final_tail_of_nulls_and_of_quantities_never_evaluated():
    # a null (a non-finite value in events.jsonl) in the tail: that quantity is null, not
    # the mean of the others; one before the tail does not count
    accs = [None] + [0.5] * 18 + [None]
    s = summarize(curve_events(accs), META, "completed", None, 0.5)
    assert s["final_tail"] == {"loss": None, "accuracy": None, "evals": 2}
    s = summarize(curve_events(accs[:-1] + [0.7]), META, "completed", None, 0.5)
    assert s["final_tail"] == {"loss": pytest.approx(0.4), "accuracy": 0.6, "evals": 2}
    # a language model: a perplexity, an accuracy of null; the tail has what `final` has
    lm = [
        {"kind": "eval", "t": float(t), "version": t, "split": "test", "loss": 4.0 - 0.1 * t,
         "accuracy": None, "perplexity": 50.0 - t}
        for t in range(20)
    ]  # fmt: skip
    s = summarize(lm, META, "completed", None, 0.5)
    assert s["final"] == {"loss": pytest.approx(2.1), "accuracy": None, "perplexity": 31.0}
    assert s["final_tail"] == {
        "loss": pytest.approx(2.15),
        "accuracy": None,
        "perplexity": pytest.approx(31.5),
        "evals": 2,
    }


def test_final_tail_of_a_diverged_run_is_null():
    s = summarize(curve_events([0.5] * 20), META, "diverged", "loss is nan", 0.5)
    assert s["final_tail"] is None
    assert s["final"] == {"loss": 0.5, "accuracy": 0.5}  # `final` keeps its last snapshot


# --------------------------------------------------------------------------- events.jsonl


def test_event_log_round_trip(tmp_path):
    path = tmp_path / "sub" / "events.jsonl"  # the parent is created
    log = EventLog(path)
    log.emit("system", 0.0, event="start")
    log.emit(
        "update",
        0.1234567891,
        worker=1,
        clock=2,
        version=3,
        lag=1,
        loss=0.5,
        compute_s=0.01,
        wait_s=0.0,
        comm_s=0.002,
        clock_gap=1,
    )
    log.emit("eval", 1.5, version=3, split="test", loss=0.4, accuracy=0.9)
    log.close()
    events = read_events(path)
    assert events == [
        {"kind": "system", "t": 0.0, "event": "start"},
        {
            "kind": "update",
            "t": 0.123457,
            "worker": 1,
            "clock": 2,
            "version": 3,
            "lag": 1,
            "loss": 0.5,
            "compute_s": 0.01,
            "wait_s": 0.0,
            "comm_s": 0.002,
            "clock_gap": 1,
        },
        {"kind": "eval", "t": 1.5, "version": 3, "split": "test", "loss": 0.4, "accuracy": 0.9},
    ]
    assert all(schema_errors(e) == [] for e in events)
    assert len(path.read_text().splitlines()) == 3


def test_event_log_appends(tmp_path):
    path = tmp_path / "events.jsonl"
    for i in range(2):
        log = EventLog(path)
        log.emit("system", float(i), event=f"e{i}")
        log.close()
    assert [e["event"] for e in read_events(path)] == ["e0", "e1"]


def test_event_log_writes_nan_and_inf_as_null(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.emit("eval", 2.0, version=7, split="test", loss=float("nan"), accuracy=0.1)
    log.emit(
        "update",
        2.5,
        worker=0,
        clock=1,
        version=8,
        lag=0,
        loss=float("inf"),
        compute_s=0.1,
        wait_s=0.0,
        comm_s=0.0,
        clock_gap=0,
    )
    log.close()
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    for line in text.splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"invalid JSON constant {c}"))
    events = read_events(path)
    assert events[0]["loss"] is None and events[0]["accuracy"] == 0.1
    assert events[1]["loss"] is None


def test_read_events_skips_torn_last_line(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.emit("system", 0.0, event="start")
    log.emit("worker", 1.0, worker=0, event="stop")
    log.close()
    with open(path, "a") as f:
        f.write('{"kind": "update", "t": 1.2, "wor')  # a writer killed mid-line
    assert read_events(path) == [
        {"kind": "system", "t": 0.0, "event": "start"},
        {"kind": "worker", "t": 1.0, "worker": 0, "event": "stop"},
    ]


def test_read_events_missing_file(tmp_path):
    assert read_events(tmp_path / "absent.jsonl") == []


def test_schema_errors():
    good = update(1.0, 0, 1, 1, lag=0, compute_s=0.1, clock_gap=0)
    assert schema_errors(good) == []
    for e in make_events():
        assert schema_errors(e) == [], e

    missing = {k: v for k, v in good.items() if k != "lag"}
    errors = schema_errors(missing)
    assert len(errors) == 1 and "'lag'" in errors[0] and "update" in errors[0]

    no_t = {k: v for k, v in good.items() if k != "t"}
    assert schema_errors(no_t) == ["t missing or not a number"]
    assert schema_errors({**good, "t": "soon"}) == ["t missing or not a number"]

    eval_errors = schema_errors({"kind": "eval", "t": 1.0, "version": 1, "split": "test"})
    assert sorted(eval_errors) == sorted(["eval event lacks 'loss'", "eval event lacks 'accuracy'"])

    assert schema_errors({"kind": "bogus", "t": 0.0}) == ["unknown kind 'bogus'"]
    assert schema_errors({"t": 0.0}) != []


# --------------------------------------------------------------------------- finalize


def test_finalize_writes_summary_and_parquet(tmp_path):
    events = make_events()
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))

    summary = finalize(tmp_path, META, "completed", None, 0.6)

    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == summary
    # by hand from make_events: five updates (lags 0, 1, 1, 2, 4), the test evaluations in
    # time order end at accuracy 0.75 (t = 4), the best is 0.8, 0.6 is first reached at t = 2
    assert (on_disk["updates"], on_disk["gradients"], on_disk["run_time_s"]) == (5, 5, 5.0)
    assert on_disk["lag"]["mean"] == pytest.approx(1.6) and on_disk["lag"]["max"] == 4
    assert on_disk["final"]["accuracy"] == 0.75 and on_disk["best_accuracy"] == 0.8
    assert on_disk["time_to_target_s"] == 2.0 and on_disk["bytes_sent"] == 12345
    assert {k: on_disk[k] for k in META} == META
    assert not list(tmp_path.glob("*.tmp"))  # the atomic write left nothing behind

    df = pd.read_parquet(tmp_path / "metrics.parquet")
    assert len(df) == len(events)
    # one column per event field, first seen first, and no stored pandas index: a reader
    # other than pandas (pyarrow, polars, DuckDB) sees exactly these columns
    fields = list(dict.fromkeys(k for e in events for k in e))
    assert pq.read_schema(tmp_path / "metrics.parquet").names == fields
    assert df["kind"].tolist() == [e["kind"] for e in events]
    assert df["t"].tolist() == pytest.approx([e["t"] for e in events])
    ups = df[df["kind"] == "update"]
    assert ups["lag"].tolist() == [0, 1, 1, 2, 4]
    tests = df[(df["kind"] == "eval") & (df["split"] == "test")]
    assert sorted(tests["accuracy"].tolist()) == [0.3, 0.65, 0.75, 0.8]
    end = df[df["event"] == "end"]
    assert end["bytes_sent"].tolist() == [12345]


# A signal that lands while a run ends raises in whatever runs then, an import included: a
# first `import pandas` cut short leaves options registered, and every later import of it
# fails ("Option ... has already been registered"). Import state is the process's, so each
# case runs in a fresh interpreter: the hook below raises as a SIGTERM would, right after
# pandas registers its first option.
_SIGNAL_MID_IMPORT = """
import json, sys
from pathlib import Path
from stalebench.metrics.summary import finalize, load_writers, stop

class Signal(BaseException):
    pass

class Hook:  # once pandas's registry of options is loaded: a signal right after an option
    fired = False  # is registered (pandas.core.config_init looks it up at each call)
    def find_spec(self, name, path=None, target=None):
        config = sys.modules.get("pandas._config.config")
        register = getattr(config, "register_option", None)
        if register and not hasattr(register, "cut"):
            def cut(*args, **kwargs):
                register(*args, **kwargs)
                if not Hook.fired:
                    Hook.fired = True
                    raise Signal(args[0])
            cut.cut = True
            config.register_option = cut

run_dir, meta = Path(sys.argv[1]), json.loads(sys.argv[3])
if sys.argv[2] == "preloaded":
    load_writers()  # what RunRecord does before a run starts
sys.meta_path.insert(0, Hook())
try:
    finalize(run_dir, meta, "failed", "a worker lost", 0.5)  # the run's own end
except Signal:
    stop(run_dir, meta, "interrupted", "interrupted by SIGTERM", 0.5)  # the interrupt's
print(json.dumps({"fired": Hook.fired}))
"""


@pytest.mark.parametrize("preloaded", [True, False])
def test_a_signal_in_the_first_import_of_pandas_still_leaves_a_summary(tmp_path, preloaded):
    import subprocess
    import sys

    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in make_events()))
    how = "preloaded" if preloaded else "cold"
    out = subprocess.run(
        [sys.executable, "-c", _SIGNAL_MID_IMPORT, str(tmp_path), how, json.dumps(META)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    fired = json.loads(out.stdout.splitlines()[-1])["fired"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["updates"] == 5
    if preloaded:  # the writers were loaded before: nothing is imported as the run ends
        assert not fired and summary["error"] == "a worker lost"
        assert len(pd.read_parquet(tmp_path / "metrics.parquet")) == len(make_events())
    else:  # cut short: no table, and summary.json says why
        assert fired and not (tmp_path / "metrics.parquet").exists()
        said = "interrupted by SIGTERM; then metrics.parquet not written: OptionError: "
        assert summary["error"].startswith(said), summary["error"]


def test_metrics_parquet_is_typed_with_the_runs_labels_on_every_row(tmp_path):
    events = make_events()
    events[0] = {**events[0], "algorithm": "ssp", "seed": 3, "num_workers": 2, "engine": "ps"}
    events[-1] = {**events[-1], "virtual_time": True}
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    finalize(tmp_path, META, "completed", None, 0.6)

    schema = pq.read_schema(tmp_path / "metrics.parquet")
    kind = {f.name: str(f.type) for f in schema}
    # integers stay integers (null where an event lacks the field), floats floats
    for col in ("version", "lag", "worker", "clock", "clock_gap", "bytes_sent", "seed"):
        assert kind[col] == "int64", (col, kind[col])
    assert kind["t"] == kind["loss"] == kind["accuracy"] == "double"
    assert kind["virtual_time"] == "bool"
    df = pd.read_parquet(tmp_path / "metrics.parquet")
    assert df["version"].isna().sum() == 3  # start, worker stop, end carry no version
    # the labels of the start event on every row: many runs' tables concatenate
    assert (df["algorithm"] == "ssp").all() and (df["seed"] == 3).all()
    assert (df["num_workers"] == 2).all() and (df["engine"] == "ps").all()


def test_finalize_with_torn_line_and_nulls(tmp_path):
    events = make_events()[:-1] + [evaluation(4.9, 6, "test", None, None)]
    text = "".join(json.dumps(e) + "\n" for e in events) + '{"kind": "sys'
    (tmp_path / "events.jsonl").write_text(text)
    summary = finalize(tmp_path, META, "diverged", "loss is nan", 0.6)
    assert summary["status"] == "diverged" and summary["error"] == "loss is nan"
    assert summary["final"] == {"loss": None, "accuracy": None}
    assert summary["run_time_s"] == 3.5  # no end event: the last update's t
    df = pd.read_parquet(tmp_path / "metrics.parquet")
    assert len(df) == len(events)
    assert math.isnan(df["accuracy"].iloc[-1])


def test_progress_fields_of_a_short_run_by_hand():
    # 2 workers, under a second of wall time; worker 0 pushes clocks 0 and 1, worker 1
    # clock 0; one update carries no clock_gap (the field is optional): it counts as 0
    meta = {**META, "num_workers": 2}
    events = [
        update(0.1, 0, 0, 1, lag=0, compute_s=0.1, clock_gap=0),
        {k: v for k, v in update(0.2, 1, 0, 2, lag=1, compute_s=0.3, clock_gap=0).items()
         if k != "clock_gap"},
        update(0.3, 0, 1, 3, lag=1, compute_s=0.1, clock_gap=0),
        {"kind": "system", "t": 0.5, "event": "end", "bytes_sent": 10},
    ]  # fmt: skip
    s = summarize(events, meta, "completed", None, 0.6)
    assert s["max_clock_gap"] == 0
    # steps per worker: 2 and 1
    assert s["clocks"] == {"mean": 1.5, "std": 0.5, "min": 1, "max": 2}
    # compute per worker 0.2 s and 0.3 s of 0.5 s: fractions 0.4 and 0.6
    assert s["compute_fraction"] == pytest.approx(0.5)
    assert s["throughput_updates_per_s"] == pytest.approx(3 / 0.5)


def test_a_run_that_ended_before_any_update():
    events = [{"kind": "system", "t": 2.0, "event": "end", "bytes_sent": 0}]
    s = summarize(events, META, "failed", "worker 1 died", 0.6)
    assert (s["updates"], s["gradients"], s["max_clock_gap"]) == (0, 0, 0)
    assert s["clocks"] == {"mean": None, "std": None, "min": None, "max": None}
    assert s["compute_fraction"] == 0.0 and s["throughput_updates_per_s"] == 0.0


def test_an_event_log_in_a_new_nested_directory(tmp_path):
    log = EventLog(tmp_path / "runs" / "a" / "events.jsonl")
    log.emit("system", 0.0, event="start")
    log.close()
    assert read_events(tmp_path / "runs" / "a" / "events.jsonl")[0]["event"] == "start"


@pytest.mark.parametrize(("flush_s", "on_disk"), [(0.0, 1), (1e-9, 1), (3600.0, 0)])
def test_an_event_reaches_the_file_at_once_or_within_flush_s(tmp_path, flush_s, on_disk):
    # 0: line-buffered; 1e-9 s: the period is over by the first emit, so it is flushed;
    # an hour: still in the buffer (no time-based wait in this test, only the two extremes)
    log = EventLog(tmp_path / "events.jsonl", flush_s=flush_s)
    log.emit("system", 0.0, event="start")
    assert len(read_events(tmp_path / "events.jsonl")) == on_disk
    log.close()
    assert len(read_events(tmp_path / "events.jsonl")) == 1


def test_pipeline_weight_gap_and_stage_delay_by_hand():
    # 3 stages; stage 2 applied nothing yet: no weight gap of its own, a delay of 0
    meta = {**META, "num_workers": 3}
    start = {"kind": "system", "t": 0.0, "event": "start", "one_stream": True}
    updates = [
        {**update(0.1, 0, 0, 1, lag=2, compute_s=0.1, clock_gap=0), "weight_gap": 0.5},
        {**update(0.2, 0, 1, 2, lag=1, compute_s=0.1, clock_gap=0), "weight_gap": 1.5},
        {**update(0.3, 1, 0, 3, lag=1, compute_s=0.1, clock_gap=0), "weight_gap": 4.0},
    ]
    s = summarize([start, *updates], meta, "completed", None, 0.6)
    assert s["weight_gap"] == {"mean": 2.0, "per_stage": [1.0, 4.0, None]}
    assert s["stage_delay"] == [2, 1, 0]
    # a cost-only pipeline's updates have no weight gap (a value); the delays stay
    bare = [{k: v for k, v in e.items() if k != "weight_gap"} for e in updates]
    s = summarize([start, *bare], {**meta, "numerics": False}, "completed", None, 0.6)
    assert "weight_gap" not in s and s["stage_delay"] == [2, 1, 0]
    # workers that are not stages (no `one_stream`) have neither
    s = summarize(updates, meta, "completed", None, 0.6)
    assert "weight_gap" not in s and "stage_delay" not in s


def test_the_table_types_a_field_by_what_every_event_set_it_to(tmp_path):
    # ints with gaps stay integers (Int64), bools with gaps booleans, a field both int and
    # float a float
    events = [
        {"kind": "system", "t": 0.0, "event": "start", "flag": True, "mixed": 1},
        {**update(0.5, 1, 0, 1, lag=0, compute_s=0.1, clock_gap=0), "flag": None, "mixed": 2.5},
        {**update(1.0, 0, 0, 2, lag=2, compute_s=0.1, clock_gap=0), "none": None},
    ]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    summary = finalize(tmp_path, META, "completed", None, 0.6)
    assert summary["status"] == "completed", summary["error"]
    df = pd.read_parquet(tmp_path / "metrics.parquet")
    dtypes = {col: str(df[col].dtype) for col in df.columns}
    assert dtypes["worker"] == dtypes["lag"] == "Int64" and dtypes["flag"] == "boolean"
    assert dtypes["t"] == dtypes["mixed"] == "float64"
    assert df["worker"].isna().tolist() == [True, False, False]
    assert df["worker"].tolist()[1:] == [1, 0] and df["flag"].tolist()[0] is True


def test_the_table_is_pandas_own_from_the_events_as_rows():
    # built a column at a time, the table is the one pandas makes from the events as rows,
    # with the integer and boolean rules: column order first seen first, NaN where a row
    # lacks a field, a string, a dict, a never-set and a None-only field as pandas types them
    from stalebench.metrics.summary import metrics_table

    events = [
        {"kind": "system", "t": 0.0, "event": "start", "parts": {"a": "b"}, "none": None},
        {"kind": "update", "t": 0.5, "worker": 1, "note": "x", "never": None, "none": None},
        {"kind": "update", "t": 1.0, "worker": 0, "parts": {"c": "d"}, "flag": True, "none": None},
        {"kind": "system", "t": 1.5, "event": "end", "big": 2**62, "flag": False, "none": None},
    ]
    want = pd.DataFrame(events)
    for col, dtype in (("worker", "Int64"), ("big", "Int64"), ("flag", "boolean")):
        want[col] = want[col].astype(dtype)
    got = metrics_table(events)
    pd.testing.assert_frame_equal(got, want)
    assert str(got["never"].dtype) == "float64" and str(got["none"].dtype) == "object"


def test_an_event_of_numbers_is_written_as_json_writes_it(tmp_path):
    # events whose values are all numbers are written by a format of their shape (a long
    # run's updates): the same text as json.dumps, and kept as read back; any other value
    # (a bool, a string, None, a non-finite float) takes the encoder
    rows = [
        {"worker": 3, "clock": 2**70, "version": -5, "x": 0.1, "y": -0.0, "z": 1e16, "w": 5e-324},
        {"worker": 3, "clock": 1, "version": 2, "x": 1.0, "y": 2.5e-7, "z": 123456.789, "w": 0},
        {"100%": 1, 'a "b"': 2.0, "é": 3},
        {"flag": True, "n": 1},
        {"note": "x", "n": 1.5},
        {"gone": None, "n": 2},
        {"loss": float("nan"), "n": 3},
    ]
    path = tmp_path / "events.jsonl"
    log = EventLog(path, keep=True)
    log.emit_all("update", 1.25, rows[:2])
    for i, row in enumerate(rows[2:]):
        log.emit("a%sb" if i == 0 else "update", 0.1 * i, **row)
    log.close()
    lines = path.read_text().splitlines()
    kinds = ["update", "update", "a%sb", *["update"] * 4]
    times = [1.25, 1.25, *(round(0.1 * i, 6) for i in range(5))]
    want = [{"kind": k, "t": t, **row} for k, t, row in zip(kinds, times, rows, strict=True)]
    assert lines[:-1] == [json.dumps(e, allow_nan=False) for e in want[:-1]]
    assert json.loads(lines[-1])["loss"] is None  # non-finite: null
    assert log.kept == read_events(path)


def test_a_label_only_the_start_event_sets_is_on_every_row_typed_as_its_value():
    # the run's labels (from the start event) fill their columns; a label other events set
    # too keeps the column they make
    from stalebench.metrics.summary import metrics_table

    events = [
        {"kind": "system", "t": 0.0, "event": "start", "algorithm": "ssp", "seed": 3,
         "num_workers": 2, "runtime": None, "engine": "ps"},
        {"kind": "update", "t": 0.5, "worker": 1},
        {"kind": "system", "t": 1.0, "event": "end", "engine": "allreduce"},
    ]  # fmt: skip
    got = metrics_table(events)
    assert got["algorithm"].tolist() == ["ssp"] * 3 and str(got["algorithm"].dtype) == "str"
    assert got["seed"].tolist() == [3] * 3 and str(got["seed"].dtype) == "Int64"
    assert got["num_workers"].tolist() == [2] * 3
    assert got["runtime"].isna().all()
    engine = got["engine"]
    assert engine[0] == "ps" and pd.isna(engine[1]) and engine[2] == "allreduce"
    assert list(got.columns) == list(pd.DataFrame(events).columns)
