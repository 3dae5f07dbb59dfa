"""stalebench.report.tables in-process: summary_table, format_summary, to_markdown, to_latex
and write_table on run tables shaped as collect() returns them; every expected value is
computed by hand from the runs built here.

Complements test_report.py (which goes through collect() and the CLI and checks a few
cells): these tests compare whole outputs, so that a wrong column name, digit count,
separator or escape fails them."""

from __future__ import annotations

import math

import pandas as pd
from pandas.testing import assert_frame_equal, assert_series_equal

from stalebench.report.tables import (
    _col,
    baseline_note,
    format_summary,
    summary_table,
    to_latex,
    to_markdown,
    write_table,
)

NAN = float("nan")


def run(
    algorithm,
    seed,
    status="completed",
    *,
    cluster="homogeneous",
    num_workers=4,
    acc=None,
    loss=None,
    ttt=None,
    lag=None,
    throughput=None,
    clock="simulated",
):
    """One row of collect()'s `runs`: the labels, status and error first, then the flattened
    summary.json (final.accuracy -> final_accuracy, lag.mean -> lag_mean, ...) and the
    clock its times are on."""
    return {
        "run_dir": f"/sweep/{algorithm}/{seed}",
        "algorithm": algorithm,
        "cluster": cluster,
        "num_workers": num_workers,
        "seed": seed,
        "status": status,
        "error": None if status == "completed" else f"{status} at update 3",
        "final_loss": loss,
        "final_accuracy": acc,
        "target_accuracy": 0.4,
        "time_to_target_s": ttt,
        "lag_mean": lag,
        "throughput_updates_per_s": throughput,
        "clock": clock,
    }


# Rows deliberately out of order (ssp, bsp, asp, dssp interleaved): the table sorts its groups.
SWEEP = [
    run("ssp", 0, acc=0.55, loss=1.2, ttt=None, lag=3.0, throughput=40.0),  # never reached target
    run("bsp", 0, acc=0.5, loss=1.0, ttt=10.0, lag=0.0, throughput=10.0),
    run("asp", 0, acc=0.6, loss=0.9, ttt=3.0, lag=1.0, throughput=15.5),
    run("asp", 2, "diverged", acc=NAN, loss=NAN, lag=5.0, throughput=99.0),
    run("dssp", 0, "failed", acc=0.3, loss=2.0, lag=1.0, throughput=5.0),
    run("bsp", 1, acc=0.7, loss=0.8, ttt=12.0, lag=0.0, throughput=20.0),
    run("asp", 1, acc=0.8, loss=0.7, ttt=5.0, lag=2.5, throughput=25.1),
    run("asp", 3, "failed", acc=0.1, loss=3.0, lag=4.0, throughput=50.0),
    run("dssp", 1, None),  # a summary.json without a status field
    run("bsp", 2, acc=0.9, loss=0.6, ttt=14.0, lag=0.0, throughput=30.0),
]

SUMMARY_COLUMNS = [
    "algorithm",
    "cluster",
    "num_workers",
    "runs",
    "completed",
    "status",
    "clock",
    "final_accuracy_mean",
    "final_accuracy_std",
    "final_loss_mean",
    "final_loss_std",
    "time_to_target_mean",
    "time_to_target_std",
    "target_split",
    "target_accuracy",
    "reached_target",
    "lag_mean",
    "throughput_updates_per_s",
    "speedup_vs_BSP",
]


def test_summary_table_aggregates_the_completed_runs_of_each_group():
    table = summary_table(pd.DataFrame(SWEEP))
    # Groups in sorted order asp, bsp, dssp, ssp (not the order the runs came in).
    # Only completed runs enter the means; sample std (ddof=1), NaN over fewer than 2 values.
    # asp: completed seeds 0, 1; diverged seed 2 and failed seed 3 are counted, not averaged.
    #   acc mean (0.6 + 0.8) / 2 = 0.7, std sqrt((0.1^2 + 0.1^2) / 1) = sqrt(0.02)
    #   loss mean (0.9 + 0.7) / 2 = 0.8, std sqrt(0.02)
    #   ttt mean (3 + 5) / 2 = 4.0, std sqrt((1 + 1) / 1) = sqrt(2); both reached it
    #   lag (1.0 + 2.5) / 2 = 1.75; throughput (15.5 + 25.1) / 2 = 20.3
    #   speedup vs BSP = bsp's mean ttt / asp's = 12 / 4 = 3.0
    # bsp: acc [0.5, 0.7, 0.9] mean 0.7, std sqrt((0.04 + 0 + 0.04) / 2) = 0.2;
    #   loss [1.0, 0.8, 0.6] mean 0.8, std 0.2; ttt [10, 12, 14] mean 12, std 2;
    #   lag 0; throughput (10 + 20 + 30) / 3 = 20; speedup 12 / 12 = 1.0 ("bsp" matches BSP)
    # dssp: nothing completed -> every metric NaN; the status-less run is listed as "unknown"
    # ssp: one completed run -> its values, std NaN; never reached the target -> ttt NaN,
    #   0 reached, no speedup
    expected = pd.DataFrame(
        [
            ["asp", "homogeneous", 4, 4, 2, "diverged×1, failed×1", "simulated", 0.7,
             math.sqrt(0.02), 0.8, math.sqrt(0.02), 4.0, math.sqrt(2), "test", 0.4, 2, 1.75,
             20.3, 3.0],
            ["bsp", "homogeneous", 4, 3, 3, "", "simulated", 0.7, 0.2,
             0.8, 0.2, 12.0, 2.0, "test", 0.4, 3, 0.0, 20.0, 1.0],
            # dssp: no run completed; the target its runs were given is still the group's
            ["dssp", "homogeneous", 4, 2, 0, "failed×1, unknown×1", "simulated", NAN, NAN,
             NAN, NAN, NAN, NAN, "test", 0.4, 0, NAN, NAN, NAN],
            ["ssp", "homogeneous", 4, 1, 1, "", "simulated", 0.55, NAN,
             1.2, NAN, NAN, NAN, "test", 0.4, 0, 3.0, 40.0, NAN],
        ],
        columns=SUMMARY_COLUMNS,
    )  # fmt: skip
    assert_frame_equal(table, expected)


def test_format_summary_shows_mean_pm_std_and_a_dash_when_missing():
    shown = format_summary(summary_table(pd.DataFrame(SWEEP)))
    # The numbers of the test above: accuracy and loss with 3 decimals, time to target with 2,
    # mean lag with 2, updates/s with 1, speedup with 2 and "×"; "mean ± std" where the std
    # exists, the bare mean over a single run (ssp), "—" where there is no value at all.
    # sqrt(0.02) = 0.1414 -> "0.141"; sqrt(2) = 1.414 -> "1.41"; 20.3 -> "20.3".
    assert shown.to_dict("records") == [
        {
            "algorithm": "asp",
            "cluster": "homogeneous",
            "workers": "4",
            "runs": "4",
            "completed": "2",
            "not completed": "diverged×1, failed×1",
            "final test accuracy": "0.700 ± 0.141",
            "final test loss": "0.800 ± 0.141",
            "time to target (simulated s)": "4.00 ± 1.41",
            "reached test accuracy >= 0.4": "2/2",
            "mean lag": "1.75",
            "updates per simulated s": "20.3",
            "speedup vs BSP": "3.00×",
        },
        {
            "algorithm": "bsp",
            "cluster": "homogeneous",
            "workers": "4",
            "runs": "3",
            "completed": "3",
            "not completed": "—",
            "final test accuracy": "0.700 ± 0.200",
            "final test loss": "0.800 ± 0.200",
            "time to target (simulated s)": "12.00 ± 2.00",
            "reached test accuracy >= 0.4": "3/3",
            "mean lag": "0.00",
            "updates per simulated s": "20.0",
            "speedup vs BSP": "1.00×",
        },
        {
            "algorithm": "dssp",
            "cluster": "homogeneous",
            "workers": "4",
            "runs": "2",
            "completed": "0",
            "not completed": "failed×1, unknown×1",
            "final test accuracy": "—",
            "final test loss": "—",
            "time to target (simulated s)": "—",
            "reached test accuracy >= 0.4": "0/0",
            "mean lag": "—",
            "updates per simulated s": "—",
            "speedup vs BSP": "—",
        },
        {
            "algorithm": "ssp",
            "cluster": "homogeneous",
            "workers": "4",
            "runs": "1",
            "completed": "1",
            "not completed": "—",
            "final test accuracy": "0.550",
            "final test loss": "1.200",
            "time to target (simulated s)": "—",
            "reached test accuracy >= 0.4": "0/1",
            "mean lag": "3.00",
            "updates per simulated s": "40.0",
            "speedup vs BSP": "—",
        },
    ]


def test_speedup_needs_the_baseline_in_the_same_cluster_and_a_positive_time():
    runs = pd.DataFrame(
        [
            run("BSP", 0, ttt=2.0),
            run("asp", 0, ttt=0.5),  # under 1 s: 2.0 / 0.5 = 4.0
            run("ssp", 0, ttt=0.0),  # reached at the first evaluation: no ratio (not inf)
            run("asp", 1, cluster="heterogeneous", ttt=1.0),  # no BSP on this cluster
            run("asp", 2, num_workers=8, ttt=1.0),  # no BSP with 8 workers
        ]
    )
    table = summary_table(runs)
    # sorted groups: (BSP, homogeneous, 4), (asp, heterogeneous, 4), (asp, homogeneous, 4),
    # (asp, homogeneous, 8), (ssp, homogeneous, 4); "BSP" sorts before lower case
    assert table[["algorithm", "cluster", "num_workers"]].values.tolist() == [
        ["BSP", "homogeneous", 4],
        ["asp", "heterogeneous", 4],
        ["asp", "homogeneous", 4],
        ["asp", "homogeneous", 8],
        ["ssp", "homogeneous", 4],
    ]
    assert_series_equal(
        table["speedup_vs_BSP"],
        pd.Series([1.0, NAN, 4.0, NAN, NAN], name="speedup_vs_BSP"),
    )
    assert format_summary(table)["speedup vs BSP"].tolist() == ["1.00×", "—", "4.00×", "—", "—"]


def test_two_labels_matching_the_baseline_in_one_cell_give_no_speedup_rather_than_a_guess():
    # "BSP" (algorithm.name=BSP on the command line) next to the preset's "bsp": the baseline
    # of that cell is ambiguous, so no ratio; another cell with one baseline still gets its own
    runs = pd.DataFrame(
        [
            run("BSP", 0, ttt=2.0),
            run("bsp", 0, ttt=4.0),
            run("asp", 0, ttt=1.0),
            run("bsp", 1, num_workers=8, ttt=3.0),
            run("asp", 1, num_workers=8, ttt=1.5),
        ]
    )
    table = summary_table(runs)
    cells = zip(table["algorithm"], table["num_workers"], strict=True)
    speedup = dict(zip(cells, table["speedup_vs_BSP"], strict=True))
    assert all(isinstance(v, float) for v in speedup.values())
    assert math.isnan(speedup[("asp", 4)]) and math.isnan(speedup[("BSP", 4)])
    assert speedup[("asp", 8)] == 2.0 and speedup[("bsp", 8)] == 1.0


def test_a_run_without_a_cluster_label_keeps_a_row_of_its_own():
    # collect() leaves `cluster` empty for a run with neither summary.json nor a readable
    # start event or .hydra/config.yaml; such a run is counted, never dropped.
    runs = pd.DataFrame([run("asp", 0, acc=0.5), run("asp", 1, cluster=None, acc=0.7)])
    table = summary_table(runs)
    assert table["runs"].tolist() == [1, 1]
    assert table["cluster"].isna().tolist() == [False, True]  # missing labels sort last
    assert table["final_accuracy_mean"].tolist() == [0.5, 0.7]


def test_a_value_that_is_not_a_number_counts_as_missing():
    # e.g. a hand-edited summary.json with "time_to_target_s": "n/a": seed 1 did not reach
    # the target, seed 0 did in 4.0 s -> mean 4.0 over 1 run (std NaN), 1 of 2 reached.
    runs = pd.DataFrame([run("asp", 0, ttt=4.0), run("asp", 1, ttt="n/a")])
    row = summary_table(runs).iloc[0]
    assert (row["time_to_target_mean"], row["reached_target"]) == (4.0, 1)
    assert math.isnan(row["time_to_target_std"])


def test_col_reads_a_missing_column_as_nan_on_the_frames_own_rows():
    # summary_table takes columns from a filtered group, whose index is not 0..n-1
    runs = pd.DataFrame([run("asp", 0), run("asp", 1)], index=[7, 9])
    assert_series_equal(_col(runs, "bytes_sent"), pd.Series([NAN, NAN], index=[7, 9]))


def test_to_markdown_writes_a_header_a_rule_and_one_line_per_row_with_pipes_escaped():
    table = pd.DataFrame(
        {"name": ["a|b", "two\nlines"], "p|q": [1, 2.5]},
        index=[5, 6],  # the index is not a column of the table
    )
    assert to_markdown(table) == (
        "| name | p\\|q |\n"  # a literal "|" becomes "\|", in the header too
        "|---|---|\n"
        "| a\\|b | 1.0 |\n"  # the column holds 1 and 2.5, so pandas stores floats
        "| two lines | 2.5 |\n"  # a newline inside a cell becomes a space
    )


def test_to_latex_writes_a_booktabs_tabular_with_latex_specials_escaped():
    table = pd.DataFrame(
        {
            "run_dir": ["a_b & c", "x\\y {z} $5 #1 ~^"],
            "acc %": ["0.700 ± 0.141", "—"],
            "speedup": ["2.50×", "—"],
        },
        index=[3, 4],  # the index is not a column of the table
    )
    assert to_latex(table) == (
        "\\begin{tabular}{lll}\n"  # one "l" per column
        "\\toprule\n"
        "run\\_dir & acc \\% & speedup \\\\\n"
        "\\midrule\n"
        "a\\_b \\& c & 0.700 $\\pm$ 0.141 & 2.50$\\times$ \\\\\n"
        "x\\textbackslash{}y \\{z\\} \\$5 \\#1 \\textasciitilde{}\\textasciicircum{}"
        " & --- & --- \\\\\n"
        "\\bottomrule\n"
        "\\end{tabular}\n"
    )


def test_write_table_writes_csv_and_tex_under_out_tables_and_returns_the_markdown(tmp_path):
    runs = pd.DataFrame(
        [
            run("bsp", 0, acc=0.25, loss=1.5, ttt=2.0, lag=0.5, throughput=8.0),
            run("bsp", 1, acc=0.5, loss=1.0, ttt=4.0, lag=0.5, throughput=8.0),
            run("bsp", 2, acc=0.75, loss=0.5, ttt=6.0, lag=0.5, throughput=8.0),
            run("bsp", 3, "failed", acc=0.1),
        ]
    )
    # acc mean 0.5, std sqrt((0.0625 + 0 + 0.0625) / 2) = 0.25; loss mean 1.0, std
    # sqrt((0.25 + 0 + 0.25) / 2) = 0.5; ttt mean 4.0, std sqrt((4 + 0 + 4) / 2) = 2.0;
    # 4 runs, 3 completed (all reached the target), 1 failed; speedup 4.0 / 4.0 = 1.0
    numeric = summary_table(runs)
    out = tmp_path / "report"  # does not exist yet: write_table creates out/tables
    markdown = write_table("summary", numeric, format_summary(numeric), out)

    assert sorted(p.name for p in out.iterdir()) == ["tables"]
    assert sorted(p.name for p in (out / "tables").iterdir()) == ["summary.csv", "summary.tex"]
    assert (
        (out / "tables" / "summary.csv").read_text(encoding="utf-8")
        == (
            ",".join(SUMMARY_COLUMNS) + "\n"  # no index column
            "bsp,homogeneous,4,4,3,failed×1,simulated,0.5,0.25,1.0,0.5,4.0,2.0,test,0.4,3,0.5,8.0,"
            "1.0\n"
        )
    )
    assert (out / "tables" / "summary.tex").read_text(encoding="utf-8") == (
        "\\begin{tabular}{lllllllllllll}\n"
        "\\toprule\n"
        "algorithm & cluster & workers & runs & completed & not completed & "
        "final test accuracy & final test loss & time to target (simulated s) & "
        "reached test accuracy >= 0.4 & mean lag & updates per simulated s & speedup vs BSP "
        "\\\\\n"
        "\\midrule\n"
        "bsp & homogeneous & 4 & 4 & 3 & failed$\\times$1 & 0.500 $\\pm$ 0.250 & "
        "1.000 $\\pm$ 0.500 & 4.00 $\\pm$ 2.00 & 3/3 & 0.50 & 8.0 & 1.00$\\times$ \\\\\n"
        "\\bottomrule\n"
        "\\end{tabular}\n"
    )
    assert markdown == (
        "| algorithm | cluster | workers | runs | completed | not completed | "
        "final test accuracy | final test loss | time to target (simulated s) | "
        "reached test accuracy >= 0.4 | mean lag | updates per simulated s | speedup vs BSP |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
        "| bsp | homogeneous | 4 | 4 | 3 | failed×1 | 0.500 ± 0.250 | 1.000 ± 0.500 | "
        "4.00 ± 2.00 | 3/3 | 0.50 | 8.0 | 1.00× |\n"
    )


def test_a_table_mixing_clocks_says_each_rows_clock_and_no_unit_of_one():
    # a simulated asp next to a real one (runtime splits the group): no column name can
    # say the clock, so a `clock` column says it per row; a run of unknown clock shows "—"
    runs = pd.DataFrame([
        run("asp", 0, ttt=2.0, throughput=5.0),
        run("asp", 0, num_workers=8, ttt=3.0, throughput=6.0, clock="real"),
        run("asp", 0, num_workers=16, ttt=4.0, throughput=7.0, clock=None),
    ])  # fmt: skip
    shown = format_summary(summary_table(runs))
    assert shown["clock"].tolist() == ["simulated", "real", "—"]
    assert shown["time to target (s)"].tolist() == ["2.00", "3.00", "4.00"]
    assert shown["updates/s"].tolist() == ["5.0", "6.0", "7.0"]
    assert list(shown.columns).index("clock") < list(shown.columns).index("time to target (s)")


def test_one_clock_is_named_in_the_columns_with_its_unit():
    runs = pd.DataFrame([run("asp", 0, ttt=2.0, throughput=5.0, clock="real")])
    shown = format_summary(summary_table(runs))
    assert "clock" not in shown
    assert shown[["time to target (real s)", "updates per real s"]].values.tolist() == [
        ["2.00", "5.0"]
    ]


def test_reached_names_the_target_per_row_where_the_rows_differ_in_it():
    # asp to 0.4 on the test split, bsp to 0.6 on the validation split (a tuning run)
    runs = pd.DataFrame([
        run("asp", 0, acc=0.5, ttt=2.0),
        {**run("bsp", 0, acc=0.7, ttt=4.0), "target_accuracy": 0.6, "eval_split": "val"},
        {**run("bsp", 1, acc=0.5), "target_accuracy": 0.6, "eval_split": "val"},
    ])  # fmt: skip
    shown = format_summary(summary_table(runs))
    assert shown["reached"].tolist() == ["test accuracy >= 0.4: 1/1", "val accuracy >= 0.6: 1/2"]


def test_an_empty_speedup_column_is_explained_with_the_flag_that_fills_it():
    runs = pd.DataFrame([run("asp", 0, ttt=2.0), run("ssp", 0, ttt=3.0)])
    table = summary_table(runs)
    assert format_summary(table)["speedup vs BSP"].tolist() == ["—", "—"]
    assert baseline_note(table) == (
        "No BSP run here, so `speedup vs BSP` is empty: `stalebench-report --baseline "
        "<algorithm>` measures the speedups against another algorithm (asp, ssp)."
    )
    # with the baseline among the runs (any case), nothing to explain
    assert baseline_note(summary_table(pd.DataFrame([run("bsp", 0, ttt=1.0)]))) is None
    assert baseline_note(table, "asp") is None


def test_a_target_setting_keeps_a_name_apart_from_the_tables_target_column():
    # budget.target_accuracy differs between two asp groups: a setting, which must not take
    # the name of the summary's own `target_accuracy` (what `reached` is counted to)
    runs = pd.DataFrame([{**run("asp", 0, ttt=1.0), "target_accuracy": 0.4},
                         {**run("asp", 1, ttt=2.0), "target_accuracy": 0.6}])  # fmt: skip
    configs = {
        r["run_dir"]: {"algorithm": {"name": "asp"}, "seed": r["seed"],
                       "budget": {"target_accuracy": r["target_accuracy"]}}
        for r in runs.to_dict("records")
    }  # fmt: skip
    table = summary_table(runs, configs=configs)
    assert table["budget.target_accuracy"].tolist() == [0.4, 0.6]
    assert table["target_accuracy"].tolist() == [0.4, 0.6]
    shown = format_summary(table)
    assert shown["reached"].tolist() == ["test accuracy >= 0.4: 1/1", "test accuracy >= 0.6: 1/1"]
