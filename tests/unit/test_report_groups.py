"""The report's groups: runs pool over seeds only when every other config value (but
bookkeeping) is the same, and each group is labelled so that two groups can be told apart.

Run directories are written here as a run leaves them (.hydra/config.yaml, summary.json,
events.jsonl); every expected number is computed by hand from the values written."""

from __future__ import annotations

import copy
import json
import math

import pandas as pd
import pytest
import yaml

from stalebench.report.cli import main
from stalebench.report.collect import collect
from stalebench.report.figures import label_runs
from stalebench.report.groups import assign, short_names, text
from stalebench.report.tables import format_summary, summary_table
from tests.unit import test_collect

BASE = yaml.safe_load(test_collect.CONFIG_YAML)  # the ssp preset, heterogeneous, 4 workers
ALLREDUCE = {"engine": {"name": "allreduce", "bucket_mb": 0.0, "schedule": "fifo"}}


def _set(config: dict, dotted: str, value) -> None:
    *path, last = dotted.split(".")
    for key in path:
        config = config.setdefault(key, {})
    config[last] = value


def make_run(root, name, *, seed=0, acc=0.5, ttt=None, algorithm="ssp", config=True, **changes):
    """A completed run: `changes` are dotted config keys (`algorithm__update__lr=0.1`, or a
    whole section as a dict) applied to the ssp preset's config.yaml."""
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    cfg = copy.deepcopy(BASE)
    cfg.update(seed=seed, run_dir=str(run))
    for key, value in changes.items():
        _set(cfg, key.replace("__", "."), value)
    if config:
        (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    summary = {
        "status": "completed",
        "error": None,
        "algorithm": algorithm,
        "engine": cfg["engine"]["name"],
        "runtime": cfg["runtime"],
        "model": cfg["model"]["name"],
        "dataset": cfg["dataset"]["name"],
        "cluster": cfg["cluster"]["preset"],
        "num_workers": cfg["cluster"]["num_workers"],
        "seed": seed,
        "wall_time_s": 2.0,
        "updates": 4,
        "final": {"loss": 1.0 - acc, "accuracy": acc},
        "time_to_target_s": ttt,
        "lag": {"mean": 1.0},
        "throughput_updates_per_s": 2.0,
    }
    (run / "summary.json").write_text(json.dumps(summary))
    events = [
        {"kind": "update", "t": 0.5 * v, "version": v, "lag": 1, "worker": v % 2, "clock": v,
         "loss": 1.0, "compute_s": 0.4, "wait_s": 0.1, "comm_s": 0.0, "clock_gap": 0}
        for v in range(1, 5)
    ] + [
        {"kind": "eval", "t": t, "version": 2 * t, "split": "test", "loss": 1.0 - acc * t / 2,
         "accuracy": acc * t / 2}
        for t in (0.0, 1.0, 2.0)
    ]  # fmt: skip
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return run


def table_of(root):
    runs, _, _ = collect([root])
    return summary_table(runs)


def test_an_lr_grid_gives_a_row_per_learning_rate_pooled_over_seeds(tmp_path):
    make_run(tmp_path, "0", seed=0, acc=0.5, ttt=4.0, algorithm__update__lr=0.1)
    make_run(tmp_path, "1", seed=1, acc=0.7, ttt=6.0, algorithm__update__lr=0.1)
    make_run(tmp_path, "2", seed=0, acc=0.2, algorithm__update__lr=1000.0)
    make_run(tmp_path, "3", seed=1, acc=0.4, algorithm__update__lr=1000.0)
    table = table_of(tmp_path)
    # two rows, sorted by lr; lr=0.1: acc (0.5 + 0.7) / 2 = 0.6, std sqrt(0.02); ttt 5 ± sqrt(2)
    # lr=1000: acc 0.3 ± sqrt(0.02), never reached the target; not one row of 0.45 ± 0.22
    assert table[["algorithm", "cluster", "num_workers", "lr", "runs"]].values.tolist() == [
        ["ssp", "heterogeneous", 4, 0.1, 2],
        ["ssp", "heterogeneous", 4, 1000.0, 2],
    ]
    assert table["final_accuracy_mean"].tolist() == pytest.approx([0.6, 0.3])
    assert table["final_accuracy_std"].tolist() == pytest.approx([math.sqrt(0.02)] * 2)
    assert table["time_to_target_mean"].iloc[0] == pytest.approx(5.0)
    assert math.isnan(table["time_to_target_mean"].iloc[1])
    shown = format_summary(table)
    assert list(shown.columns[:5]) == ["algorithm", "cluster", "workers", "lr", "runs"]
    assert shown["lr"].tolist() == ["0.1", "1000"]
    assert shown["final test accuracy"].tolist() == ["0.600 ± 0.141", "0.300 ± 0.141"]


def test_two_engines_give_two_rows_and_the_speedup_compares_like_with_like(tmp_path):
    make_run(tmp_path, "0", algorithm="bsp", ttt=8.0)
    make_run(tmp_path, "1", algorithm="bsp", ttt=4.0, **ALLREDUCE)
    make_run(tmp_path, "2", algorithm="asp", ttt=2.0)
    table = table_of(tmp_path)
    # the engine's own options (bucket_mb, schedule) are not named: its name tells them apart
    assert table[["algorithm", "engine", "runs"]].values.tolist() == [
        ["asp", "ps", 1],
        ["bsp", "allreduce", 1],
        ["bsp", "ps", 1],
    ]
    assert "bucket_mb" not in table and "schedule" not in table
    # asp on ps against BSP on ps: 8 / 2 = 4, not against a mix of both engines
    assert table["speedup_vs_BSP"].tolist() == pytest.approx([4.0, 1.0, 1.0])


def test_the_speedup_needs_a_baseline_with_every_setting_that_its_groups_vary(tmp_path):
    # BSP varies lr and engine; asp with lr 0.05 on ps has no BSP of both: no ratio (not
    # the allreduce BSP that matches its lr); asp with lr 0.1 on ps has one: 3.5 / 1.0
    make_run(tmp_path, "0", seed=0, algorithm="bsp", ttt=3.0, algorithm__update__lr=0.1)
    make_run(tmp_path, "1", seed=1, algorithm="bsp", ttt=4.0, algorithm__update__lr=0.1)
    make_run(tmp_path, "2", algorithm="bsp", ttt=2.0, algorithm__update__lr=0.05, **ALLREDUCE)
    make_run(tmp_path, "3", algorithm="asp", ttt=1.0, algorithm__update__lr=0.1)
    make_run(tmp_path, "4", algorithm="asp", ttt=1.5, algorithm__update__lr=0.05)
    table = table_of(tmp_path)
    rows = table[["algorithm", "lr", "engine", "speedup_vs_BSP"]].values.tolist()
    assert rows[:2] == [["asp", 0.05, "ps", pytest.approx(math.nan, nan_ok=True)],
                        ["asp", 0.1, "ps", pytest.approx(3.5)]]  # fmt: skip
    assert rows[2:] == [["bsp", 0.05, "allreduce", 1.0], ["bsp", 0.1, "ps", 1.0]]


def test_two_runtimes_give_two_rows_named_by_runtime(tmp_path):
    make_run(tmp_path, "0", seed=0, runtime="sim")
    make_run(tmp_path, "1", seed=1, runtime="sim")
    make_run(tmp_path, "2", seed=0, runtime="real")
    table = table_of(tmp_path)
    assert table[["runtime", "runs"]].values.tolist() == [["real", 1], ["sim", 2]]


def test_two_slowdown_lists_are_two_profiles_a_reader_can_tell_apart(tmp_path):
    make_run(tmp_path, "0", seed=0, cluster__slowdown=[1, 1, 3, 3], acc=0.4)
    make_run(tmp_path, "1", seed=1, cluster__slowdown=[1, 1, 3, 3], acc=0.6)
    make_run(tmp_path, "2", seed=0, cluster__slowdown=[1, 1, 1, 4], acc=0.8)
    make_run(tmp_path, "3", seed=0, cluster__preset="homogeneous", cluster__slow_fraction=0.0)
    table = table_of(tmp_path)
    assert table[["cluster", "runs"]].values.tolist() == [
        ["heterogeneous[slowdown=1,1,1,4]", 1],
        ["heterogeneous[slowdown=1,1,3,3]", 2],
        ["homogeneous", 1],  # the only run of its preset: nothing to tell apart
    ]
    assert table["final_accuracy_mean"].tolist() == pytest.approx([0.8, 0.5, 0.5])


def test_a_changed_straggler_probability_names_the_profile(tmp_path):
    make_run(tmp_path, "0", cluster__straggler_prob=0.0)
    make_run(tmp_path, "1", cluster__straggler_prob=0.05, cluster__straggler_factor=10.0)
    assert set(table_of(tmp_path)["cluster"]) == {
        "heterogeneous[straggler_prob=0; straggler_factor=5]",
        "heterogeneous[straggler_prob=0.05; straggler_factor=10]",
    }


def test_seeds_and_bookkeeping_are_pooled_while_a_setting_is_not(tmp_path):
    # the seed, the run directory, the logger, the sweep's claims, resume/overwrite and the
    # supervisor's limits differ: one group of three; a fourth run with another batch size
    # is a group of its own
    make_run(tmp_path, "0", seed=0, acc=0.3)
    make_run(tmp_path, "1", seed=1, acc=0.5, logger__name="wandb", resume=True, timeout_s=5.0)
    make_run(tmp_path, "2", seed=2, acc=0.7, overwrite=True, checkpoint_every_s=1.0,
             sweep__claims=[{"id": "x"}], sweep__name="other", dataset__root="/data")  # fmt: skip
    make_run(tmp_path, "3", seed=0, acc=0.9, dataset__batch_size=64)
    table = table_of(tmp_path)
    assert table[["algorithm", "batch_size", "runs"]].values.tolist() == [
        ["ssp", 32, 3],
        ["ssp", 64, 1],
    ]
    assert table["final_accuracy_mean"].tolist() == pytest.approx([0.5, 0.9])
    assert table["final_accuracy_std"].iloc[0] == pytest.approx(0.2)  # (0.3, 0.5, 0.7)


def test_what_differs_between_two_algorithms_is_not_a_setting(tmp_path):
    # ssp and asp presets differ in algorithm.name and the barrier's fields: their rows are
    # told apart by the algorithm; a staleness grid inside ssp is a setting of ssp's
    make_run(tmp_path, "0", algorithm="asp", algorithm__name="asp",
             algorithm__barrier={"name": "asp", "apply": "per_arrival"})  # fmt: skip
    make_run(tmp_path, "1", algorithm="ssp", algorithm__barrier__staleness=1)
    make_run(tmp_path, "2", algorithm="ssp", algorithm__barrier__staleness=3)
    table = table_of(tmp_path)
    assert list(table.columns[:5]) == ["algorithm", "cluster", "num_workers", "staleness", "runs"]
    shown = format_summary(table)
    assert shown[["algorithm", "staleness"]].values.tolist() == [
        ["asp", "—"],  # asp has no staleness
        ["ssp", "1"],
        ["ssp", "3"],
    ]


def test_runs_without_a_config_are_grouped_by_their_summary_labels(tmp_path):
    make_run(tmp_path, "0", seed=0, config=False, acc=0.2)
    make_run(tmp_path, "1", seed=1, config=False, acc=0.4)
    make_run(tmp_path, "2", seed=0, config=False, acc=0.9, **ALLREDUCE)
    table = table_of(tmp_path)
    assert table[["algorithm", "engine", "runs"]].values.tolist() == [
        ["ssp", "allreduce", 1],
        ["ssp", "ps", 2],
    ]
    assert table["final_accuracy_mean"].tolist() == pytest.approx([0.9, 0.3])


def test_a_run_without_a_config_is_not_pooled_with_runs_that_have_one(tmp_path):
    make_run(tmp_path, "0", seed=0, algorithm__update__lr=0.1)
    make_run(tmp_path, "1", seed=1, config=False)
    labelled, _ = assign(collect([tmp_path])[0])
    assert labelled["group"].tolist() == [
        "ssp / heterogeneous / 4 workers",
        "ssp / heterogeneous / 4 workers / (no config)",
    ]


def test_group_labels_name_every_setting_that_tells_groups_apart(tmp_path):
    for i, (lr, engine) in enumerate([(0.1, {}), (0.1, ALLREDUCE), (0.01, {})]):
        make_run(tmp_path, str(i), algorithm__update__lr=lr, **engine)
    labelled, settings = assign(collect([tmp_path])[0])
    assert settings == {"algorithm.update.lr": "lr", "engine.name": "engine"}
    assert labelled["group"].tolist() == [
        "ssp / heterogeneous / 4 workers / lr=0.1 engine=ps",
        "ssp / heterogeneous / 4 workers / lr=0.1 engine=allreduce",
        "ssp / heterogeneous / 4 workers / lr=0.01 engine=ps",
    ]
    assert labelled["arm"].tolist() == [
        "ssp lr=0.1 engine=ps",
        "ssp lr=0.1 engine=allreduce",
        "ssp lr=0.01 engine=ps",
    ]


def test_figures_draw_one_curve_per_group(tmp_path):
    for i, (seed, lr) in enumerate([(0, 0.1), (1, 0.1), (0, 0.01), (1, 0.01)]):
        make_run(tmp_path, str(i), seed=seed, algorithm__update__lr=lr)
    runs, curves, updates = collect([tmp_path])
    curves, updates = label_runs(runs, curves, updates)
    per_arm = curves.groupby("arm")["run_dir"].nunique().to_dict()
    assert per_arm == {"ssp lr=0.01": 2, "ssp lr=0.1": 2}
    assert set(updates["arm"]) == {"ssp lr=0.01", "ssp lr=0.1"}


def test_the_report_keeps_the_groups_apart_in_every_output(tmp_path):
    root = tmp_path / "sweep"
    make_run(root, "0", seed=0, algorithm__update__lr=0.1, cluster__slowdown=[1, 1, 3, 3])
    make_run(root, "1", seed=1, algorithm__update__lr=0.1, cluster__slowdown=[1, 1, 3, 3])
    make_run(root, "2", seed=0, algorithm__update__lr=0.01, cluster__slowdown=[1, 1, 3, 3])
    make_run(root, "3", seed=0, algorithm__update__lr=0.1, cluster__slowdown=[1, 1, 1, 4])
    out = tmp_path / "out"
    assert main([str(root), "--out", str(out)]) == 0
    summary = pd.read_csv(out / "tables" / "summary.csv")
    assert summary[["cluster", "lr", "runs"]].values.tolist() == [
        ["heterogeneous[slowdown=1,1,1,4]", 0.1, 1],
        ["heterogeneous[slowdown=1,1,3,3]", 0.01, 1],
        ["heterogeneous[slowdown=1,1,3,3]", 0.1, 2],
    ]
    per_run = pd.read_csv(out / "tables" / "runs.csv")
    assert per_run["group"].nunique() == 3
    assert {"algorithm.update.lr", "cluster.slowdown", "profile", "arm"} <= set(per_run.columns)
    assert "| lr |" in (out / "report.md").read_text()
    tex = (out / "tables" / "summary.tex").read_text()
    assert r"heterogeneous[slowdown=1,1,3,3] & 4 & 0.1 & 2" in tex
    curves = sorted(p.name for p in (out / "figures").glob("test_accuracy_vs_time_*.png"))
    assert curves == [
        "test_accuracy_vs_time_heterogeneous-slowdown-1-1-1-4-_w4.png",
        "test_accuracy_vs_time_heterogeneous-slowdown-1-1-3-3-_w4.png",
    ]


@pytest.mark.parametrize(
    ("keys", "names"),
    [
        (["algorithm.update.lr"], ["lr"]),
        (["algorithm.update.lr", "algorithm.inner.lr"], ["update.lr", "inner.lr"]),
        (["engine.name", "runtime", "algorithm.update.name"], ["engine", "runtime", "update"]),
        (["algorithm.name"], ["algorithm.name"]),  # "algorithm" is the label's own column
    ],
)
def test_short_names_are_the_shortest_unambiguous_suffix(keys, names):
    assert list(short_names(keys).values()) == names


@pytest.mark.parametrize(
    ("value", "shown"),
    [(0.1, "0.1"), (1e-05, "1e-05"), (20.0, "20"), (3, "3"), (True, "true"), (None, "null"),
     ([1, 1, 3.0], "1,1,3"), ([], "[]"), ({"worker": 1, "action": "die"}, "{worker:1 action:die}"),
     ("fifo", "fifo")],
)  # fmt: skip
def test_values_print_as_a_config_reads(value, shown):
    assert text(value) == shown
