"""stalebench.report.collect: which directories are runs and in what order, how the lines of
events.jsonl that a killed or damaged run leaves are read, the error of a run without a
readable summary.json, and the columns of the three tables; on run directories built in the
formats a run writes. Each test kills mutants that tests/unit/test_collect.py leaves alive."""

import json
import os
import warnings

import pytest

from stalebench.report.collect import collect, read_events
from tests.unit import test_collect

# .hydra/config.yaml of the default ssp preset, and .hydra/overrides.yaml of
# `runtime=sim dataset=synthetic budget.max_updates=3`
CONFIG_YAML = test_collect.CONFIG_YAML
OVERRIDES_YAML = "- runtime=sim\n- dataset=synthetic\n- budget.max_updates=3\n"

# the run of test_collect.py with the ssp preset unswapped
START = {**test_collect.START, "algorithm": "ssp", "barrier": "ssp"}
UPDATES, END = test_collect.UPDATES, test_collect.END
EVALS = [
    {"kind": "eval", "t": t, "version": v, "split": split, "loss": loss, "accuracy": acc}
    for t, v, loss, acc in ((0.0, 0, 1.39, 0.25), (0.04, 3, 1.1, 0.62))
    for split in ("test", "train")
]
EVENTS = [START, *UPDATES, END, *EVALS]
# summary.json of that run, in the order finalize() writes it
SUMMARY = {
    "status": "completed",
    "error": None,
    "algorithm": "ssp",
    "barrier": "ssp",
    "update_rule": "sgd",
    "engine": "ps",
    "runtime": "sim",
    "model": "mlp",
    "dataset": "synthetic",
    "cluster": "heterogeneous",
    "num_workers": 4,
    "seed": 0,
    "host": {"machine": "x86_64", "cpus": 2, "load_avg": [1.0, 0.8, 0.7]},
    "wall_time_s": 0.04,
    "updates": 3,
    "gradients": 3,
    "final": {"loss": 1.1, "accuracy": 0.62},
    "best_accuracy": 0.62,
    "target_accuracy": 0.6,
    "time_to_target_s": 0.04,
    "lag": {"mean": 1.0, "p50": 1.0, "p99": 1.98, "max": 2},
    "max_clock_gap": 0,
    "clocks": {"mean": 0.75, "std": 0.4330127018922193, "min": 0.0, "max": 1.0},
    "compute_fraction": 0.5,
    "throughput_updates_per_s": 75.0,
    "bytes_sent": 0,
    "sharding": "disjoint",
    "sim_loop_s": 0.3,
}
FIRST_COLUMNS = ["run_dir", "algorithm", "cluster", "num_workers", "seed", "status", "error"]
DAMAGED = "\0" * 16  # a line a crash left unreadable
TORN = '{"kind": "update", "t": 0.06, "version": 4, "la'  # the line a killed writer left


def jsonl(events):
    return "".join(json.dumps(e) + "\n" for e in events)


def make_run(run, events=EVENTS, summary=SUMMARY, hydra=True):
    """A run directory: .hydra/ (unless hydra=False), events.jsonl and summary.json (unless
    None)."""
    run.mkdir(parents=True)
    if hydra:
        (run / ".hydra").mkdir()
        (run / ".hydra" / "config.yaml").write_text(CONFIG_YAML)
        (run / ".hydra" / "overrides.yaml").write_text(OVERRIDES_YAML)
    if events is not None:
        (run / "events.jsonl").write_text(jsonl(events))
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return run


def run_dirs(runs):
    return list(runs["run_dir"])


# which directories are runs, and their order


def test_a_directory_holding_only_summary_json_is_a_run(tmp_path):
    # summary.json copied off the cluster without the events and Hydra's files
    run = make_run(tmp_path / "copied" / "ssp-seed0", events=None, hydra=False)
    runs, curves, updates = collect([tmp_path])
    assert run_dirs(runs) == [str(run.resolve())]
    assert (runs.loc[0, "status"], runs.loc[0, "final_accuracy"]) == ("completed", 0.62)
    assert curves.empty and updates.empty


@pytest.mark.parametrize(
    ("events", "hydra"),
    [
        (None, True),  # stopped during start-up, before its first event: .hydra/ only
        (EVENTS, False),  # an events.jsonl outside a Hydra output directory
    ],
    ids=["hydra-only", "events-only"],
)
def test_a_directory_without_summary_is_a_run_only_with_both_events_and_hydra(
    tmp_path, events, hydra
):
    run = make_run(tmp_path / "multirun" / "0")
    make_run(tmp_path / "multirun" / "1", events=events, summary=None, hydra=hydra)
    runs, _, _ = collect([tmp_path])
    assert run_dirs(runs) == [str(run.resolve())]


def test_runs_under_a_hidden_directory_are_not_collected(tmp_path):
    run = make_run(tmp_path / "multirun" / "0")
    make_run(tmp_path / ".Trash-1000" / "files" / "0")  # a deleted run still on the disk
    runs, _, _ = collect([tmp_path])
    assert run_dirs(runs) == [str(run.resolve())]


def test_the_jobs_of_a_multirun_are_in_numeric_order(tmp_path):
    sweep = tmp_path / "multirun" / "2024-05-01" / "10-20-30"
    for job in range(12):
        make_run(sweep / str(job))
    runs, _, _ = collect([tmp_path])
    jobs = [d.rsplit("/", 1)[1] for d in run_dirs(runs)]
    assert jobs == ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11"]


def test_numbered_jobs_come_first_in_numeric_order_then_named_siblings(tmp_path):
    # a sweep directory holding Hydra's numbered jobs next to a run someone named by hand
    for job in ["10", "baseline", "2", "ablation"]:
        make_run(tmp_path / "sweep" / job)
    runs, _, _ = collect([tmp_path])
    jobs = [d.rsplit("/", 1)[1] for d in run_dirs(runs)]
    assert jobs == ["2", "10", "ablation", "baseline"]


def test_a_summary_json_with_bytes_that_are_not_utf8_is_an_unreadable_summary(tmp_path):
    run = make_run(tmp_path / "multirun" / "0", summary=None)
    (run / "summary.json").write_bytes(b'{"status": "compl\xff')
    runs, _, _ = collect([tmp_path])
    (row,) = runs.to_dict("records")
    assert row["status"] == "failed" and row["algorithm"] == "ssp"
    assert row["error"].startswith("unreadable summary.json: 'utf-8' codec can't decode byte 0xff")


# events.jsonl


def test_a_torn_last_line_of_bytes_that_are_not_utf8_is_skipped(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(jsonl([START, *UPDATES]).encode() + b'{"kind": "upd\xff\xfe\x00')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_events(path) == [START, *UPDATES]


def test_the_events_after_a_blank_line_are_read(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text(jsonl([START, UPDATES[0]]) + "\n  \n" + jsonl(UPDATES[1:]))
    assert read_events(path) == [START, *UPDATES]


@pytest.mark.parametrize(
    ("text", "warned"),
    [
        (jsonl([START, *UPDATES]) + TORN, []),  # a killed run: skipped without a word
        (
            jsonl([START, *UPDATES[:2]]) + DAMAGED + "\n" + jsonl(UPDATES[2:]),
            ["events.jsonl:4: unreadable event line skipped"],  # damage inside the file
        ),
    ],
    ids=["torn-last-line", "damaged-second-to-last-line"],
)
def test_only_an_unreadable_line_that_is_not_the_last_is_warned_about(tmp_path, text, warned):
    path = tmp_path / "events.jsonl"
    path.write_text(text)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert read_events(path) == [START, *UPDATES]
    assert [str(w.message).removeprefix(f"{tmp_path}/") for w in record] == warned


@pytest.mark.skipif(
    "MUTANT_UNDER_TEST" in os.environ, reason="mutmut's trampoline is one more frame on the stack"
)
def test_the_warning_about_an_unreadable_line_points_at_the_caller_of_read_events(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text(DAMAGED + "\n" + jsonl([START]))
    with pytest.warns(UserWarning, match="events.jsonl:1: unreadable event line skipped") as rec:
        read_events(path)
    assert [w.filename for w in rec] == [__file__]


# a run without a readable summary.json


@pytest.mark.parametrize(
    ("error_event", "error"),
    [
        (
            {"event": "error", "error": "deadlock: the barrier holds every worker (clocks [1])"},
            "no summary.json (last error event: deadlock: the barrier holds every worker "
            "(clocks [1]))",
        ),
        (  # an out-of-tree engine that calls the field `message`
            {"event": "error", "message": "worker 2: connection reset by peer"},
            "no summary.json (last error event: worker 2: connection reset by peer)",
        ),
    ],
    ids=["error", "message"],
)
def test_a_run_without_summary_names_its_last_error_event(tmp_path, error_event, error):
    # the run ended with an error (the error event, then the end event) and died before
    # writing summary.json
    end = {**END, "status": "failed"}
    events = [START, *UPDATES, {"kind": "system", "t": 0.04, **error_event}, end]
    make_run(tmp_path / "multirun" / "0", events=events, summary=None)
    runs, _, _ = collect([tmp_path])
    assert (runs.loc[0, "status"], runs.loc[0, "error"]) == ("failed", error)


NO_VERSION = {k: v for k, v in UPDATES[0].items() if k != "version"}


@pytest.mark.parametrize(
    ("events", "updates"),
    [([START, *UPDATES, NO_VERSION], 3), ([START, NO_VERSION], 0)],
    ids=["with-versioned-updates", "alone"],
)
def test_an_update_event_without_version_adds_no_update(tmp_path, events, updates):
    # the schema requires `version`; an engine that leaves it out must not break the report
    make_run(tmp_path / "multirun" / "0", events=events, summary=None)
    runs, _, _ = collect([tmp_path])
    assert runs.loc[0, "updates"] == updates


def test_a_truncated_summary_json_keeps_the_run_labelled_from_its_events(tmp_path):
    run = make_run(tmp_path / "multirun" / "0", summary=None)
    (run / "summary.json").write_text('{"status": "completed", "err')  # a copy cut short
    runs, _, updates = collect([tmp_path])
    assert runs.to_dict("records") == [
        {
            "run_dir": str(run.resolve()),
            "algorithm": "ssp",
            "cluster": "heterogeneous",
            "num_workers": 4,
            "seed": 0,
            "status": "failed",
            "error": "unreadable summary.json: "
            "Unterminated string starting at: line 1 column 25 (char 24)",
            "sharding": "disjoint",
            "barrier": "ssp",
            "update_rule": "sgd",
            "engine": "ps",
            "runtime": "sim",
            "model": "mlp",
            "dataset": "synthetic",
            "clock": "simulated",  # the runtime's: its times are virtual
            "run_time_s": 0.04,
            "wall_time_s": 0.04,  # the same number, for the readers of the old key
            "updates": 3,
        }
    ]
    assert list(updates["algorithm"]) == ["ssp"] * 3


# the tables' columns


@pytest.mark.parametrize("summary", [SUMMARY, None], ids=["completed", "no-summary"])
def test_the_runs_table_starts_with_run_dir_labels_status_and_error(tmp_path, summary):
    make_run(tmp_path / "multirun" / "0", summary=summary)
    runs, _, _ = collect([tmp_path])
    assert list(runs.columns[:7]) == FIRST_COLUMNS


def test_curves_keep_their_columns_when_no_run_was_evaluated(tmp_path):
    # killed during training: updates, no eval event
    make_run(tmp_path / "multirun" / "0", events=[START, *UPDATES], summary=None)
    _, curves, updates = collect([tmp_path])
    assert curves.empty
    assert list(curves.columns) == [
        *FIRST_COLUMNS[:5],
        *["t", "version", "split", "loss", "accuracy", "perplexity"],
    ]
    assert len(updates) == 3
