"""stalebench.report on run directories written by hand (no engine, no torch)."""

import json
import math
import subprocess
import sys

import pytest

from stalebench.report.cli import main
from stalebench.report.collect import collect, read_events
from stalebench.report.tables import format_summary, summary_table


def make_run(
    root,
    name,
    algorithm,
    seed,
    status="completed",
    acc=0.5,
    ttt=None,
    summary=True,
    torn=False,
    lag=0.0,
):
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(
        f"algorithm:\n  name: {algorithm}\n  barrier:\n    name: x\ncluster:\n"
        f"  name: profile\n  preset: homogeneous\n  num_workers: 2\n  slowdown: []\n"
        f"runtime: sim\nseed: {seed}\n"
    )
    events = [
        {
            "kind": "system",
            "t": 0.0,
            "event": "start",
            "algorithm": algorithm,
            "cluster": "homogeneous",
            "num_workers": 2,
            "seed": seed,
        }
    ]
    for v in range(1, 5):
        for w in range(2):
            events.append(
                {
                    "kind": "update",
                    "t": 0.5 * v,
                    "version": v,
                    "lag": w,
                    "worker": w,
                    "clock": v - 1,
                    "loss": 2.0,
                    "compute_s": 0.4,
                    "wait_s": 0.1 * w,
                    "comm_s": 0.0,
                    "clock_gap": 0,
                }
            )
    for t in (0.0, 1.0, 2.0):
        for split in ("test", "train"):
            events.append(
                {
                    "kind": "eval",
                    "t": t,
                    "version": int(2 * t),
                    "split": split,
                    "loss": 2.0 - t / 2,
                    "accuracy": 0.1 + acc * t / 2,
                }
            )
    text = "".join(json.dumps(e) + "\n" for e in events)
    if torn:
        text += '{"kind": "update", "t": 2.5, "vers'
    (run / "events.jsonl").write_text(text)
    if summary:
        (run / "summary.json").write_text(
            json.dumps(
                {
                    "status": status,
                    "error": None if status == "completed" else f"{status} at update 3",
                    "algorithm": algorithm,
                    "cluster": "homogeneous",
                    "num_workers": 2,
                    "seed": seed,
                    "runtime": "sim",
                    "wall_time_s": 2.0,  # summary.json as it was before `run_time_s`
                    "updates": 4,
                    "final": {"loss": 1.0, "accuracy": acc},
                    "best_accuracy": acc,
                    "target_accuracy": 0.4,
                    "time_to_target_s": ttt,
                    "lag": {"mean": lag, "p50": 0.0, "p99": 1.0, "max": 1},
                    "max_clock_gap": 0,
                    "compute_fraction": 0.8,
                    "throughput_updates_per_s": 2.0,
                }
            )
        )
    return run


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "sweep"
    make_run(root, "0", "bsp", 0, acc=0.50, ttt=4.0)
    make_run(root, "1", "bsp", 1, acc=0.60, ttt=6.0)
    make_run(root, "2", "asp", 0, acc=0.70, ttt=1.0, lag=1.0)
    make_run(root, "3", "asp", 1, acc=0.80, ttt=3.0, lag=2.0)
    make_run(root, "4", "asp", 2, status="diverged", acc=float("nan"))
    make_run(root, "5", "asp", 3, status="failed", acc=0.1)
    make_run(root, "6", "ssp", 0, summary=False, torn=True)
    make_run(root, "7", "ssp", 1, acc=0.55)  # never reaches the target
    return root


def test_collect_finds_every_run_with_its_status(sweep):
    runs, curves, updates = collect([sweep])
    assert len(runs) == 8
    status = dict(zip(runs["run_dir"].str.rsplit("/", n=1).str[-1], runs["status"], strict=True))
    assert status == {
        "0": "completed",
        "1": "completed",
        "2": "completed",
        "3": "completed",
        "4": "diverged",
        "5": "failed",
        "6": "failed",
        "7": "completed",
    }
    orphan = runs[runs["run_dir"].str.endswith("/6")].iloc[0]
    assert orphan["error"] == "no summary.json"
    assert (orphan["algorithm"], orphan["seed"], orphan["num_workers"]) == ("ssp", 0, 2)
    assert {"final_accuracy", "final_loss", "lag_mean", "lag_p99"} <= set(runs.columns)
    assert len(curves) == 8 * 6 and set(curves["split"]) == {"test", "train"}
    assert len(updates) == 8 * 8  # the torn last line of run 6 is skipped
    assert list(curves.columns[:5]) == ["run_dir", "algorithm", "cluster", "num_workers", "seed"]


def test_read_events_skips_a_torn_last_line(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"kind": "eval", "t": 0}\n{"kind": "upd')
    assert read_events(path) == [{"kind": "eval", "t": 0}]


def test_summary_table_means_and_speedup_against_hand_computed_numbers(sweep):
    runs, _, _ = collect([sweep])
    table = summary_table(runs).set_index("algorithm")
    asp, bsp, ssp = table.loc["asp"], table.loc["bsp"], table.loc["ssp"]
    assert (asp["runs"], asp["completed"]) == (4, 2)
    assert asp["status"] == "diverged×1, failed×1"
    assert asp["final_accuracy_mean"] == pytest.approx(0.75)
    assert asp["final_accuracy_std"] == pytest.approx(math.sqrt(0.005))  # ddof=1
    assert asp["time_to_target_mean"] == pytest.approx(2.0)
    assert asp["time_to_target_std"] == pytest.approx(math.sqrt(2.0))
    assert asp["lag_mean"] == pytest.approx(1.5)
    assert bsp["time_to_target_mean"] == pytest.approx(5.0)
    assert asp["speedup_vs_BSP"] == pytest.approx(2.5)  # 5.0 / 2.0
    assert bsp["speedup_vs_BSP"] == pytest.approx(1.0)
    assert (ssp["runs"], ssp["completed"], ssp["reached_target"]) == (2, 1, 0)
    assert math.isnan(ssp["speedup_vs_BSP"])

    shown = format_summary(summary_table(runs)).set_index("algorithm")
    assert shown.loc["asp", "final test accuracy"] == "0.750 ± 0.071"
    assert shown.loc["asp", "final test loss"] == "1.000 ± 0.000"
    assert shown.loc["asp", "speedup vs BSP"] == "2.50×"
    assert shown.loc["ssp", "speedup vs BSP"] == "—"
    assert shown.loc["ssp", "time to target (simulated s)"] == "—"
    assert shown.loc["ssp", "reached test accuracy >= 0.4"] == "0/1"


def test_cli_writes_report_tables_and_figures(sweep, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([str(sweep), "--out", str(out)]) == 0
    report = out / "report.md"
    assert capsys.readouterr().out.strip() == str(report)
    text = report.read_text()
    assert "diverged at update 3" in text and "failed at update 3" in text
    assert "no summary.json" in text and "diverged×1, failed×1" in text
    for name in ("summary", "runs"):
        assert (out / "tables" / f"{name}.csv").stat().st_size > 0
        assert (out / "tables" / f"{name}.tex").read_text().startswith(r"\begin{tabular}")
    pngs = sorted((out / "figures").glob("*.png"))
    assert {p.name.split("_homogeneous")[0] for p in pngs} == {
        "test_accuracy_vs_time",
        "test_loss_vs_time",
        "lag_histogram",
        "worker_time",
    }
    assert all(p.stat().st_size > 1000 for p in pngs)
    assert all(f"figures/{p.name}" in text for p in pngs)


def test_cli_default_out_is_the_first_dir(sweep):
    assert main([str(sweep)]) == 0
    assert (sweep / "report.md").is_file()


def test_cli_fails_with_one_line_when_no_run_is_found(tmp_path, capsys):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    assert main([str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no run directory" in err
    assert main([str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_report_cli_imports_no_engine_runtime_or_torch():
    code = (
        "import sys, stalebench.report.cli, stalebench.report.figures\n"
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith(('torch.',"
        " 'stalebench.runtime', 'stalebench.engines', 'stalebench.experiment',"
        " 'stalebench.config', 'hydra', 'omegaconf'))]\n"
        "print(bad)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


# a damaged events.jsonl beside an intact summary.json: warned about, one line per run; the
# run is kept, its curve drawn from the lines that parse


def cut(run, keep):
    """events.jsonl cut to its first `keep` bytes (a copy cut short, a full disk)."""
    path = run / "events.jsonl"
    path.write_bytes(path.read_bytes()[:keep])
    return path


@pytest.fixture
def damaged(tmp_path):
    """Three completed runs: one whole, one whose events.jsonl is empty, one whose
    events.jsonl ends in the middle of its last eval line."""
    root = tmp_path / "sweep"
    make_run(root, "0", "bsp", 0, acc=0.5, ttt=4.0)
    cut(make_run(root, "1", "bsp", 1, acc=0.6, ttt=6.0), 0)
    torn = make_run(root, "2", "bsp", 2, acc=0.7, ttt=5.0)
    cut(torn, (torn / "events.jsonl").stat().st_size - 20)
    return root


def test_the_report_warns_once_per_damaged_event_log_and_keeps_the_runs(damaged, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([str(damaged), "--out", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    empty, torn = (damaged / "1").resolve(), (damaged / "2").resolve()
    assert err == [
        f"stalebench-report: warning: {empty}: events.jsonl is empty: its curve is left out",
        f"stalebench-report: warning: {torn}: events.jsonl: its last line (15) is cut "
        "mid-record; its curve is drawn from the 14 lines that parse",
    ]
    text = (out / "report.md").read_text()
    assert "Runs: 3 (3 completed)" in text
    for line in err:  # the report says it too
        assert f"- `{line.removeprefix('stalebench-report: warning: ').split(': ')[0]}`" in text


def test_a_truncated_run_keeps_the_curve_of_its_readable_lines(damaged):
    with pytest.warns(UserWarning) as record:
        runs, curves, updates = collect([damaged])
    assert len(record) == 2 and all("events.jsonl" in str(w.message) for w in record)
    assert list(runs["status"]) == ["completed"] * 3
    per_run = curves.groupby(curves["run_dir"].str.rsplit("/", n=1).str[-1]).size().to_dict()
    assert per_run == {"0": 6, "2": 5}  # run 2's last eval line is cut; run 1 has none
    assert set(updates["run_dir"].str.rsplit("/", n=1).str[-1]) == {"0", "2"}


def test_a_line_that_does_not_parse_inside_the_log_is_named(tmp_path, capsys):
    run = make_run(tmp_path / "sweep", "0", "bsp", 0, acc=0.5, ttt=4.0)
    lines = (run / "events.jsonl").read_text().splitlines(keepends=True)
    lines[3] = lines[3][:25] + "\n"  # a write cut short, then the log went on
    lines[5] = "\0" * 12 + "\n"
    (run / "events.jsonl").write_text("".join(lines))
    assert main([str(tmp_path / "sweep"), "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().err == (
        f"stalebench-report: warning: {run.resolve()}: events.jsonl: lines 4, 6 do not parse; "
        "its curve is drawn from the 13 lines that parse\n"
    )


@pytest.mark.parametrize(
    ("keep", "said"),
    [
        (
            lambda text: text.index('{"kind": "eval"') + 10,
            "its last line (10) is cut mid-record; none of the 9 lines that parse is an eval "
            "event: its curve is left out",
        ),
        (
            lambda text: 10,
            "its last line (1) is cut mid-record; no line parses: its curve is left out",
        ),
    ],
    ids=["in-the-first-eval-line", "in-the-first-line"],
)
def test_a_log_without_eval_events_left_says_the_curve_is_left_out(tmp_path, capsys, keep, said):
    run = make_run(tmp_path / "sweep", "0", "bsp", 0, acc=0.5, ttt=4.0)
    cut(run, keep((run / "events.jsonl").read_text()))
    assert main([str(tmp_path / "sweep"), "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().err == (
        f"stalebench-report: warning: {run.resolve()}: events.jsonl: {said}\n"
    )


def test_a_killed_run_without_summary_is_not_warned_about_its_torn_last_line(sweep, capsys):
    # run 6 of `sweep` died mid-write and is listed as failed: its torn line is no news
    assert main([str(sweep), "--out", str(sweep / "out")]) == 0
    assert capsys.readouterr().err == ""
