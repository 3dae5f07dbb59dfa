"""Tuning reads a run's length as the report does, whichever version wrote its summary.json:
`run_time_s` from a summary that has only the old `wall_time_s`, and the old key from one
that has only `run_time_s` (stalebench.metrics.summary.with_clock)."""

from __future__ import annotations

import json

import pytest

from stalebench import tuning
from stalebench.metrics.summary import with_clock
from stalebench.sweep import SelectConfig


@pytest.mark.parametrize(
    "summary",
    [
        {"runtime": "sim", "wall_time_s": 4.0},  # written before `clock`
        {"runtime": "sim", "clock": "simulated", "run_time_s": 4.0},  # written now
    ],
    ids=["old", "new"],
)
@pytest.mark.parametrize("metric", ["run_time_s", "wall_time_s"])
def test_a_tuning_run_is_scored_on_its_length_under_either_key(tmp_path, summary, metric):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(
        json.dumps({"status": "completed", "eval_split": "val", **summary})
    )
    scored = tuning.read_run(tmp_path, "run", 1000, SelectConfig(metric=metric, better="lower"))
    assert (scored.status, scored.value) == ("completed", 4.0)


def test_with_clock_says_an_old_summarys_clock_by_its_runtime_and_keeps_a_new_ones():
    assert with_clock({"runtime": "real", "wall_time_s": 2.0}) == {
        "runtime": "real", "clock": "real", "run_time_s": 2.0, "wall_time_s": 2.0,
    }  # fmt: skip
    assert with_clock({"runtime": "x"})["clock"] is None  # a runtime it does not know
    # a summary written now names its clock: that wins over the runtime's
    new = with_clock({"runtime": "sim", "clock": "real", "run_time_s": 1.0})
    assert (new["clock"], new["run_time_s"], new["wall_time_s"]) == ("real", 1.0, 1.0)
