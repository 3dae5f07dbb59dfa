"""A report that says which clock its times are on and what its columns measure, on run
directories written by hand (tests/unit/test_report.py's, whose summary.json is the old
format: `wall_time_s` and the runtime, no `clock` or `run_time_s`) and on ones in the
format a run writes now."""

from __future__ import annotations

import csv
import json

from stalebench.report.cli import main, target_section
from stalebench.report.collect import collect
from stalebench.report.groups import assign
from stalebench.sweep import TargetConfig
from tests.unit.test_report import make_run
from tests.unit.test_report_explains import Drawn


def as_written_now(run, runtime="real"):
    """The run's summary.json as this version writes it: `clock` and `run_time_s`; its
    config.yaml in `runtime`."""
    config = run / ".hydra" / "config.yaml"
    config.write_text(config.read_text().replace("runtime: sim", f"runtime: {runtime}"))
    path = run / "summary.json"
    summary = json.loads(path.read_text())
    length = summary.pop("wall_time_s")
    clock = {"sim": "simulated", "real": "real"}[runtime]
    path.write_text(json.dumps({**summary, "runtime": runtime, "clock": clock,
                                "run_time_s": length}))  # fmt: skip
    return run


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_an_old_run_directory_is_reported_on_its_runtimes_clock(tmp_path):
    root = tmp_path / "sweep"
    make_run(root, "0", "bsp", 0, ttt=4.0)  # the old format, runtime sim
    make_run(root, "1", "asp", 0, ttt=1.0)
    out = tmp_path / "out"
    assert main([str(root), "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert "| time to target (simulated s) | reached test accuracy >= 0.4 |" in text
    assert "| updates per simulated s |" in text
    runs = rows(out / "tables" / "runs.csv")
    # the run's length once, on its clock: never under the key that called it wall time
    assert [(r["clock"], r["run_time_s"]) for r in runs] == [("simulated", "2.0")] * 2
    assert "wall_time_s" not in runs[0]
    assert "wall_time_s" not in (out / "tables" / "runs.tex").read_text().replace("\\_", "_")


def test_a_report_of_simulated_and_real_runs_says_each_rows_clock(tmp_path, monkeypatch):
    drawn = Drawn(monkeypatch)
    root = tmp_path / "sweep"
    make_run(root, "0", "asp", 0, ttt=1.0)  # old format, simulated
    as_written_now(make_run(root, "1", "asp", 1, ttt=3.0), "real")
    out = tmp_path / "out"
    assert main([str(root), "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    # one group per runtime (it tells the two asp groups apart): each row says its clock
    header = next(line for line in text.splitlines() if line.startswith("| algorithm"))
    assert "| clock | final test accuracy |" in header
    assert "| time to target (s) |" in header and "| updates/s |" in header
    assert "| simulated |" in text and "| real |" in text
    # time axes of figures that hold both name both; none says wall time
    xlabels = {n: f["xlabel"] for n, f in drawn.figs.items() if not n.startswith("lag_")}
    assert sorted(xlabels) == [
        "test_accuracy_vs_time_homogeneous_w2.png",
        "test_loss_vs_time_homogeneous_w2.png",
        "worker_time_homogeneous_w2.png",
    ]
    assert xlabels["test_loss_vs_time_homogeneous_w2.png"] == (
        "time (s; clocks differ: real, simulated)"
    )
    assert xlabels["worker_time_homogeneous_w2.png"] == (
        "time per run (s; clocks differ: real, simulated)"
    )
    assert not any("wall" in x for x in xlabels.values())


def test_an_empty_speedup_column_says_which_flag_fills_it(tmp_path):
    root = tmp_path / "sweep"
    as_written_now(make_run(root, "0", "asp", 0, ttt=1.0))
    as_written_now(make_run(root, "1", "ssp", 0, ttt=2.0))
    out = tmp_path / "out"
    assert main([str(root), "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert "| time to target (real s) |" in text
    assert (
        "No BSP run here, so `speedup vs BSP` is empty: `stalebench-report --baseline "
        "<algorithm>` measures the speedups against another algorithm (asp, ssp)."
    ) in text
    # the flag it names fills the column: no line then
    assert main([str(root), "--out", str(out), "--baseline", "asp"]) == 0
    text = (out / "report.md").read_text()
    assert "| speedup vs asp |" in text and "No asp run" not in text
    assert "| 1.00× |" in text and "| 0.50× |" in text  # asp's 1 s / ssp's 2 s


def test_the_lag_legend_names_the_algorithm_as_the_other_figures_do(tmp_path, monkeypatch):
    drawn = Drawn(monkeypatch)
    root = tmp_path / "sweep"
    make_run(root, "0", "asp", 0, ttt=1.0)
    make_run(root, "1", "bsp", 0, ttt=2.0)
    assert main([str(root), "--out", str(tmp_path / "out")]) == 0
    lag = next(v for k, v in drawn.figs.items() if k.startswith("lag_histogram"))
    assert lag["legend_title"] == "algorithm" and lag["legend"] == ["asp", "bsp"]
    worker = next(v for k, v in drawn.figs.items() if k.startswith("worker_time"))
    assert worker["xlabel"] == "simulated time per run (s)"


def test_the_claims_targets_table_names_its_clock(tmp_path):
    root = tmp_path / "sweep"
    make_run(root, "0", "asp", 0)  # old format, simulated
    runs, curves, _ = collect([root])
    labelled, settings = assign(runs)
    loss = [TargetConfig("test", "loss", 1.5)]
    line, table = target_section(labelled, settings, curves, loss)[1::2]
    assert line.startswith("Time to each target the claims use (simulated s; ")
    assert "clock" not in table.splitlines()[0]
    # a real run beside it: its own group (runtime), each row says its clock
    as_written_now(make_run(root, "1", "asp", 0), "real")
    runs, curves, _ = collect([root])
    labelled, settings = assign(runs)
    line, table = target_section(labelled, settings, curves, loss)[1::2]
    assert line.startswith("Time to each target the claims use (s; ")
    assert "| clock |" in table and "| real |" in table and "| simulated |" in table
