"""The tuning protocol's selection rule (stalebench.tuning) on run directories written by
hand, and the tune block's validation: every bad value refused by its key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stalebench import tuning
from stalebench.errors import ConfigError, RunError
from stalebench.sweep import SelectConfig, SelectTargetConfig, TuneConfig

LR = "algorithm.update.lr"


def write_run(
    root: Path,
    rel: str,
    status: str = "completed",
    final_loss: float | None = 1.0,
    final_accuracy: float | None = 0.5,
    evals: list[tuple[float, float, float]] = (),
    split: str = "val",
) -> None:
    """A tuning run's directory: summary.json, and `evals` (t, loss, accuracy) as eval
    events of `split` in events.jsonl."""
    path = root / rel
    path.mkdir(parents=True)
    final = None if final_loss is None else {"loss": final_loss, "accuracy": final_accuracy}
    summary = {"status": status, "eval_split": split, "final": final, "best_accuracy": None}
    (path / "summary.json").write_text(json.dumps(summary))
    lines = [
        {"kind": "eval", "t": t, "version": i, "split": split, "loss": loss, "accuracy": acc}
        for i, (t, loss, acc) in enumerate(evals)
    ]
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))


def select_from(
    tmp_path: Path, runs: list[list[dict]], select: SelectConfig = None, values=None
) -> dict:
    """Write one cell's runs (per grid point, per tuning seed) and select from them."""
    seeds = [1000 + s for s in range(len(runs[0]))]
    values = values or [0.1 * (j + 1) for j in range(len(runs))]
    tune = TuneConfig(params={LR: values}, seeds=seeds, select=select or SelectConfig())
    for j, point in enumerate(runs):
        for s, run in zip(seeds, point, strict=True):
            write_run(tmp_path, tuning.run_dir(0, j, s), **run)
    cell = {"overrides": ["+sweep/arms/x=a"], "arm": "a", "params": {LR: values}}
    (record,) = tuning.record(tune, [cell], tmp_path)["cells"]
    return record


def ranks(record: dict) -> list[int]:
    return [c["rank"] for c in record["candidates"]]


def test_the_lower_mean_final_loss_over_the_seeds_is_selected(tmp_path):
    record = select_from(
        tmp_path,
        [
            [{"final_loss": 0.2}, {"final_loss": 1.0}],  # mean 0.6
            [{"final_loss": 0.5}, {"final_loss": 0.5}],  # mean 0.5: better on the mean
            [{"final_loss": 0.1}, {"final_loss": 2.0}],  # best single run, worst mean
        ],
    )
    assert record["selected"] == {LR: pytest.approx(0.2)}
    assert record["selected_candidate"] == 1
    assert ranks(record) == [2, 1, 3]
    assert [c["score"] for c in record["candidates"]] == pytest.approx([0.6, 0.5, 1.05])
    assert record["budget"] == 6  # 3 points × 2 seeds


def test_higher_is_better_for_final_accuracy(tmp_path):
    select = SelectConfig(metric="final_accuracy", better="higher")
    record = select_from(
        tmp_path,
        [[{"final_accuracy": 0.7}], [{"final_accuracy": 0.9}], [{"final_accuracy": 0.8}]],
        select,
    )
    assert record["selected_candidate"] == 1 and ranks(record) == [3, 1, 2]


def ttt(value: float = 0.5) -> SelectConfig:
    target = SelectTargetConfig(key="accuracy", value=value)
    return SelectConfig(metric="time_to_target", target=target, better="lower")


def test_time_to_target_reads_the_first_val_eval_reaching_it(tmp_path):
    record = select_from(
        tmp_path,
        [
            [{"evals": [(0.0, 2.0, 0.1), (1.0, 1.0, 0.6), (2.0, 0.5, 0.7)]}],  # at 1.0
            [{"evals": [(0.0, 2.0, 0.1), (0.5, 1.0, 0.5), (2.0, 0.5, 0.2)]}],  # at 0.5
        ],
        ttt(0.5),
    )
    assert [c["score"] for c in record["candidates"]] == [1.0, 0.5]
    assert record["selected_candidate"] == 1


def test_time_to_target_ignores_other_splits(tmp_path):
    path = tmp_path / "run"
    write_run(tmp_path, "run", evals=[(0.5, 0.1, 0.9)], split="test")
    assert tuning.time_to_target(path / "events.jsonl", "accuracy", 0.5) is None
    assert tuning.time_to_target(path / "events.jsonl", "loss", 0.1) is None


def test_loss_targets_are_reached_at_or_below(tmp_path):
    write_run(tmp_path, "run", evals=[(0.0, 2.0, None), (1.0, 0.25, None), (2.0, 0.1, None)])
    events = tmp_path / "run" / "events.jsonl"
    assert tuning.time_to_target(events, "loss", 0.25) == 1.0
    assert tuning.time_to_target(events, "loss", 0.2) == 2.0
    assert tuning.time_to_target(events, "loss", 0.05) is None


def test_a_tie_on_the_metric_is_broken_by_the_final_validation_loss(tmp_path):
    record = select_from(
        tmp_path,
        [
            [{"evals": [(1.0, 1.0, 0.6)], "final_loss": 0.4}],
            [{"evals": [(1.0, 1.0, 0.6)], "final_loss": 0.3}],  # same time, lower loss
        ],
        ttt(0.5),
    )
    assert record["selected_candidate"] == 1 and ranks(record) == [2, 1]


def test_a_full_tie_goes_to_the_earlier_grid_point(tmp_path):
    record = select_from(tmp_path, [[{"final_loss": 0.3}], [{"final_loss": 0.3}]])
    assert record["selected_candidate"] == 0 and ranks(record) == [1, 2]


def test_never_reaching_the_target_ranks_after_reaching_it_then_by_final_loss(tmp_path):
    reached = [(1.0, 1.0, 0.6)]
    never = [(1.0, 1.0, 0.1)]
    record = select_from(
        tmp_path,
        [
            [{"evals": never, "final_loss": 0.1}, {"evals": never, "final_loss": 0.1}],
            [{"evals": reached, "final_loss": 0.9}, {"evals": never, "final_loss": 0.9}],
            [{"evals": reached, "final_loss": 2.0}, {"evals": reached, "final_loss": 2.0}],
            [{"evals": never, "final_loss": 0.05}, {"evals": never, "final_loss": 0.05}],
        ],
        ttt(0.5),
    )
    # reached by every seed first (whatever its loss); then one seed short; then neither
    # seed, by the final validation loss
    assert ranks(record) == [4, 2, 1, 3]
    assert [c["standing"] for c in record["candidates"]] == [
        "not_reached",
        "not_reached",
        "reached",
        "not_reached",
    ]
    assert [c["score"] for c in record["candidates"]] == [None, None, 1.0, None]


@pytest.mark.parametrize("bad", ["diverged", "failed", "timeout", "interrupted", "invalid"])
def test_a_point_with_a_run_that_did_not_complete_ranks_after_every_other(tmp_path, bad):
    record = select_from(
        tmp_path,
        [
            [{"final_loss": 0.01}, {"status": bad, "final_loss": None}],  # best loss, one bad
            [{"final_loss": 5.0}, {"final_loss": 5.0}],  # poor but whole
            [{"status": bad, "final_loss": None}, {"status": bad, "final_loss": None}],
        ],
    )
    assert ranks(record) == [2, 1, 3]
    assert [c["standing"] for c in record["candidates"]] == ["failed", "reached", "failed"]
    assert record["candidates"][0]["runs"][1]["status"] == bad


def test_a_failed_point_ranks_after_one_that_never_reached_the_target(tmp_path):
    record = select_from(
        tmp_path,
        [
            [{"evals": [(1.0, 0.1, 0.9)]}, {"status": "diverged", "final_loss": None}],
            [{"evals": [(1.0, 1.0, 0.1)]}, {"evals": [(1.0, 1.0, 0.1)]}],
        ],
        ttt(0.5),
    )
    assert ranks(record) == [2, 1]


def test_a_missing_run_counts_as_failed(tmp_path):
    values = [0.1, 0.2]
    tune = TuneConfig(params={LR: values}, seeds=[1000])
    write_run(tmp_path, tuning.run_dir(0, 0, 1000), final_loss=9.0)
    (tmp_path / tuning.run_dir(0, 1, 1000)).mkdir(parents=True)  # started, no summary.json
    cell = {"overrides": [], "arm": None, "params": {LR: values}}
    (record,) = tuning.record(tune, [cell], tmp_path)["cells"]
    assert record["selected"] == {LR: 0.1}
    assert record["candidates"][1]["runs"][0]["status"] == "missing"


def test_a_tuning_run_that_evaluated_the_test_split_is_refused(tmp_path):
    with pytest.raises(RunError, match="eval.split=val"):
        select_from(tmp_path, [[{"split": "test"}], [{}]])


def test_tuning_json_records_the_protocol_and_every_cell(tmp_path):
    tune = TuneConfig(
        params={LR: [0.1, 0.2]},
        arms={"b": {"algorithm.outer.lr": [0.5, 0.7]}},
        seeds=[1000],
        validation_fraction=0.2,
    )
    cells = [
        {"overrides": ["+sweep/arms/x=a"], "arm": "a", "params": tune.params},
        {"overrides": ["+sweep/arms/x=b"], "arm": "b", "params": tune.arms["b"]},
    ]
    for i, losses in enumerate([(0.3, 0.2), (0.1, 0.4)]):
        for j, loss in enumerate(losses):
            write_run(tmp_path, tuning.run_dir(i, j, 1000), final_loss=loss)
    path = tuning.write(tmp_path, tuning.record(tune, cells, tmp_path))
    content = json.loads(path.read_text())
    assert path == tmp_path / "tuning.json"
    assert content["format"] == tuning.FORMAT
    assert (content["seeds"], content["validation_fraction"], content["budget"]) == ([1000], 0.2, 2)
    assert content["select"] == {"metric": "final_loss", "target": None, "better": "lower"}
    assert [c["selected"] for c in content["cells"]] == [{LR: 0.2}, {"algorithm.outer.lr": 0.5}]
    assert [c["arm"] for c in content["cells"]] == ["a", "b"]
    assert content["cells"][1]["candidates"][0]["runs"][0]["dir"] == "tune/1/0/1000"


def test_a_cell_whose_grid_is_empty_is_recorded_untuned(tmp_path):
    tune = TuneConfig(params={LR: [0.1]}, seeds=[1000])
    cell = {"overrides": ["+sweep/arms/x=a"], "arm": "a", "params": {}}
    content = tuning.record(tune, [cell], tmp_path)
    (record,) = content["cells"]
    assert (record["selected"], record["candidates"], record["budget"]) == ({}, [], 0)
    assert content["budget"] == 0


def test_the_grid_is_a_product_with_the_first_key_slowest():
    assert tuning.grid({"a": [1, 2], "b": ["x", "y"]}) == [
        {"a": 1, "b": "x"},
        {"a": 1, "b": "y"},
        {"a": 2, "b": "x"},
        {"a": 2, "b": "y"},
    ]


def test_summary_values_are_found_by_their_flattened_key():
    summary = {"final": {"loss": 0.5}, "lag": {"mean": 2.0}, "time_to_target_s": None, "x_y": 3}
    assert tuning.summary_value(summary, "final_loss") == 0.5
    assert tuning.summary_value(summary, "lag_mean") == 2.0
    assert tuning.summary_value(summary, "x_y") == 3
    assert tuning.summary_value(summary, "time_to_target_s") is None
    assert tuning.summary_value(summary, "final_nothing") is None


def test_a_tuning_run_is_scored_on_the_end_of_its_curve_as_claims_are():
    # the last snapshot dips; final_loss is the tail's mean (summary.json's final_tail),
    # and a summary written before final_tail existed falls back to the snapshot
    summary = {
        "final": {"loss": 0.9, "accuracy": 0.5},
        "final_tail": {"loss": 0.4, "accuracy": 0.8, "evals": 3},
    }
    assert tuning.summary_value(summary, "final_loss") == 0.4
    assert tuning.summary_value(summary, "final_accuracy") == 0.8
    assert tuning.summary_value(summary, "final_tail_evals") == 3
    assert tuning.summary_value({"final": {"loss": 0.9}}, "final_loss") == 0.9
    null_tail = {"final": {"loss": 0.9}, "final_tail": {"loss": None, "evals": 1}}
    assert tuning.summary_value(null_tail, "final_loss") is None  # not the snapshot


# -- the tune block's validation: every bad value refused by its key ----------------------

BAD_TUNES = [
    ({"params": {LR: []}}, "sweep.tune.params.algorithm.update.lr", "[]"),
    ({"params": {LR: 0.1}}, "sweep.tune.params.algorithm.update.lr", "0.1"),
    ({"params": {"seed": [1, 2]}}, "sweep.tune.params", "'seed'"),
    ({"params": {"eval.split": ["test"]}}, "sweep.tune.params", "'eval.split'"),
    (
        {"params": {LR: [0.1, 0.2]}, "arms": {"bsp": {LR: [0.1, 0.2, 0.4]}}},
        "sweep.tune.arms.bsp",
        "0.4",
    ),
    ({"arms": {"bsp": {LR: [0.1]}}}, "sweep.tune.params", "{}"),
    ({"params": {LR: [0.1]}, "seeds": []}, "sweep.tune.seeds", "[]"),
    ({"params": {LR: [0.1]}, "seeds": [7, 7]}, "sweep.tune.seeds", "[7, 7]"),
    ({"params": {LR: [0.1]}, "seeds": [-1]}, "sweep.tune.seeds", "[-1]"),
    ({"params": {LR: [0.1]}, "validation_fraction": 0.0}, "sweep.tune.validation_fraction", "0.0"),
    ({"params": {LR: [0.1]}, "validation_fraction": 0.6}, "sweep.tune.validation_fraction", "0.6"),
]


@pytest.mark.parametrize("fields, key, value", BAD_TUNES)
def test_a_bad_tune_block_is_refused_by_its_key(fields, key, value):
    with pytest.raises(ConfigError) as err:
        TuneConfig(**fields)
    assert key in str(err.value) and value in str(err.value)


BAD_SELECTS = [
    ({"metric": ""}, "sweep.tune.select.metric"),
    ({"better": "up"}, "sweep.tune.select.better"),
    ({"metric": "final_loss", "better": "higher"}, "sweep.tune.select.better"),
    ({"metric": "final_accuracy", "better": "lower"}, "sweep.tune.select.better"),
    ({"metric": "time_to_target"}, "sweep.tune.select.target"),
    (
        {"metric": "time_to_target", "target": SelectTargetConfig(value=0.5), "better": "higher"},
        "sweep.tune.select.better",
    ),
    (
        {"metric": "time_to_target", "target": SelectTargetConfig(split="test", value=0.5)},
        "sweep.tune.select.target.split",
    ),
    (
        {"metric": "time_to_target", "target": SelectTargetConfig(key="f1", value=0.5)},
        "sweep.tune.select.target.key",
    ),
]


@pytest.mark.parametrize("fields, key", BAD_SELECTS)
def test_a_bad_select_is_refused_by_its_key(fields, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        SelectConfig(**fields)


def test_a_tune_block_in_a_composed_config_is_checked_with_the_run():
    from tests.conftest import compose

    with pytest.raises(ConfigError, match=r"sweep\.tune\.arms\.bsp"):
        compose(
            [
                "++sweep.tune.params={algorithm.update.lr:[0.1,0.2]}",
                "++sweep.tune.arms={bsp:{algorithm.update.lr:[0.1]}}",
            ]
        )
    cfg = compose(["++sweep.tune.params={algorithm.update.lr:[0.1,0.2]}"])
    assert cfg.sweep.tune.on and cfg.sweep.tune.params == {LR: [0.1, 0.2]}
    assert not compose([]).sweep.tune.on
