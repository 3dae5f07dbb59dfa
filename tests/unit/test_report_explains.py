"""A sweep report that explains itself, and figures a paper can use: the tuning section, the
times to the claims' own targets, verdict lines that name their sides and unit, links from
claims to figures; PDF beside PNG, the band stated, natural order, log scale over decades,
the target line, simulated time named, worker time pooled over seeds and bounded in size.
On run directories written by hand (tests/unit/test_report.py's)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from stalebench.report import claims as C
from stalebench.report import figures as F
from stalebench.report.cli import figure_links, main, target_section, tuning_section
from stalebench.report.collect import collect
from stalebench.report.groups import assign
from stalebench.sweep import ClaimConfig, TargetConfig
from tests.unit.test_report import make_run


@pytest.fixture
def runs_dir(tmp_path):
    root = tmp_path / "sweep"
    for i, (algorithm, seed) in enumerate(
        [("SSP(10)", 0), ("SSP(3)", 0), ("SSP(1)", 0), ("SSP(10)", 1), ("SSP(3)", 1), ("SSP(1)", 1)]
    ):
        run = make_run(root, str(i), algorithm, seed, ttt=1.0)
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps({**summary, "runtime": "sim"}))
    return root


class Drawn:
    """The figures `figures._save` is given, read before they are written."""

    def __init__(self, monkeypatch):
        self.figs: dict[str, dict] = {}
        save = F._save

        def spy(fig, path):
            ax = fig.axes[0]
            legend = ax.get_legend()
            self.figs[path.name] = {
                "yscale": ax.get_yscale(),
                "xlabel": fig.axes[-1].get_xlabel(),
                "legend": [t.get_text() for t in legend.get_texts()] if legend else [],
                "legend_title": legend.get_title().get_text() if legend else "",
                "lines": [line.get_ydata()[0] for line in ax.get_lines()],
                "titles": [a.get_title() for a in fig.axes],
                "height": fig.get_size_inches()[1],
            }
            return save(fig, path)

        monkeypatch.setattr(F, "_save", spy)


def test_figures_come_as_pdf_too_ordered_naturally_with_band_and_time_named(
    runs_dir, tmp_path, monkeypatch
):
    drawn = Drawn(monkeypatch)
    out = tmp_path / "out"
    assert main([str(runs_dir), "--out", str(out)]) == 0
    pngs = sorted((out / "figures").glob("*.png"))
    assert pngs and all(p.with_suffix(".pdf").stat().st_size > 1000 for p in pngs)
    loss = next(v for k, v in drawn.figs.items() if k.startswith("test_loss"))
    assert loss["legend"] == ["SSP(1) (n=2)", "SSP(3) (n=2)", "SSP(10) (n=2)"]
    assert loss["legend_title"] == "band: ± 1 std over seeds"
    assert loss["xlabel"] == "simulated time (s)"  # the runs' config says runtime: sim
    assert loss["yscale"] == "linear"  # 2.0 down to 1.0: under a decade
    worker = next(v for k, v in drawn.figs.items() if k.startswith("worker_time"))
    assert worker["titles"][:3] == ["SSP(1) (mean of 2 seeds)", "SSP(3) (mean of 2 seeds)",
                                    "SSP(10) (mean of 2 seeds)"]  # fmt: skip
    assert worker["height"] <= F.MAX_HEIGHT


def test_a_loss_over_decades_is_on_a_log_scale_with_the_target_drawn(tmp_path, monkeypatch):
    drawn = Drawn(monkeypatch)
    runs = pd.DataFrame({"run_dir": ["a", "b"], "status": "completed", "clock": "real"})
    t = np.arange(5.0)
    curves = pd.DataFrame({
        "run_dir": ["a"] * 5 + ["b"] * 5, "t": [*t, *t], "split": "test",
        "loss": [*(10.0 ** -t), *(2 * 10.0 ** -t)], "accuracy": np.nan,
        "profile": "p", "num_workers": 2, "arm": "X", "group_index": 0,
    })  # fmt: skip
    target = TargetConfig(split="test", key="loss", value=0.01)
    F.convergence(curves, runs, tmp_path, "loss", [target])
    (fig,) = drawn.figs.values()
    assert fig["yscale"] == "log" and fig["xlabel"] == "real time (s)"
    assert 0.01 in fig["lines"] and "target 0.01" in fig["legend"]


def test_time_is_named_by_the_clock():
    # collect's `clock` (the runtime's, for an old summary): simulated or real seconds
    runs = pd.DataFrame({"run_dir": ["a", "b", "c"], "clock": ["simulated", "real", None]})
    assert F.time_label(runs, ["a"]) == "simulated time (s)"
    assert F.time_label(runs, ["b"]) == "real time (s)"
    assert F.time_label(runs, ["a", "b"]) == "time (s; clocks differ: real, simulated)"
    assert F.time_label(runs, ["c"]) == "time (s; clock unknown)"
    assert F.time_label(runs, ["b"], "time per run") == "real time per run (s)"


def test_the_summary_reads_the_claims_own_targets(runs_dir):
    runs, curves, _ = collect([runs_dir])
    labelled, settings = assign(runs)
    # make_run's test loss is 2.0 − t/2 at t = 0, 1, 2: 1.5 is reached at t = 1, 0.5 never
    lines = target_section(labelled, settings, curves, [
        TargetConfig("test", "loss", 1.5), TargetConfig("test", "loss", 0.5)])  # fmt: skip
    table = lines[-1]
    assert "time to test loss <= 1.5" in table and "time to test loss <= 0.5" in table
    assert table.count("1 ± 0 (2/2)") == 3 and table.count("— (0/2)") == 3


def test_a_verdict_line_names_its_sides_metric_and_unit():
    claim = ClaimConfig(id="x", metric="time_to_target", a={"algorithm": "SSP(3)"},
                        b={"algorithm": "BSP"}, margin=0.2, better="lower")  # fmt: skip
    test = C.Test("a − b", 5, -0.29, 0.29, (0.2, 0.38), 0.2, 0.03, "paired t", se=0.03, df=4)
    line = C._shown(claim, [test])
    assert line.startswith("time_to_target: SSP(3) − BSP = -0.29 s; advantage 0.29 s")
    assert "vs margin 0.2 s" in line
    ratio = ClaimConfig(id="r", metric="final_loss", kind="ratio", value=1.0,
                        a={"algorithm": "A", "num_workers": 8}, b={"algorithm": "B"},
                        margin=0.1, better="lower")  # fmt: skip
    assert C._shown(ratio, [test]).startswith("final_loss: algorithm=A, num_workers=8 / B = ")


def test_the_tuning_section_lists_every_candidate_the_selection_and_the_extension(tmp_path):
    tuning = {
        "select": {"metric": "time_to_target", "target": {"split": "val", "key": "loss",
                                                          "value": 0.01}, "better": "lower"},
        "seeds": [1000, 1001], "max_extensions": 4, "points": {"bsp": 3},
        "cells": [{
            "cell": 0, "arm": "bsp", "selected_candidate": 2,
            "extension": {"added": [{"candidate": 2}], "stopped": "diverged", "at_edge": []},
            "candidates": [
                {"candidate": 0, "values": {"algorithm.update.lr": 0.4}, "score": None,
                 "standing": "not_reached", "runs": [{"status": "completed"}] * 2},
                {"candidate": 1, "values": {"algorithm.update.lr": 0.8}, "score": 7.4,
                 "standing": "reached", "runs": [{"status": "completed"}] * 2},
                {"candidate": 2, "values": {"algorithm.update.lr": 1.6}, "score": 3.9,
                 "standing": "reached", "runs": [{"status": "completed"}] * 2},
                {"candidate": 3, "values": {"algorithm.update.lr": 3.2}, "score": None,
                 "standing": "failed", "runs": [{"status": "diverged"}] * 2},
            ],
        }],
    }  # fmt: skip
    (tmp_path / "tuning.json").write_text(json.dumps(tuning))
    text = "\n".join(tuning_section([str(tmp_path)]))
    assert "selected on time_to_target (val loss to 0.01), lower is better" in text
    assert "seeds 1000, 1001" in text and "bsp 3" in text
    rows = [r for r in text.splitlines() if r.startswith("| 0 bsp")]
    assert len(rows) == 4
    assert "lr=1.6 | 3.9 | reached | completed×2 |  ★ | added beyond the grid" in rows[2]
    assert "diverged×2" in rows[3] and "extension stopped: diverged" in rows[3]


def test_a_claim_links_the_figure_of_its_metric(tmp_path):
    figs = [tmp_path / "figures" / f"{n}_homogeneous_w8.png"
            for n in ("test_loss_vs_time", "test_accuracy_vs_time", "worker_time")]  # fmt: skip
    link = figure_links("time_to_target (test loss <= 0.01)", figs)
    assert link == "[homogeneous_w8](figures/test_loss_vs_time_homogeneous_w8.png)"
    assert "worker_time" in figure_links("compute_fraction", figs)
    assert figure_links("throughput_updates_per_s", figs) == "—"


def test_a_summary_of_runs_without_accuracy_shows_no_accuracy_target(runs_dir):
    from stalebench.report.tables import format_summary, summary_table

    runs, _, _ = collect([runs_dir])
    with_accuracy = format_summary(summary_table(runs))
    assert "time to target (simulated s)" in with_accuracy
    assert "final test accuracy" in with_accuracy
    regression = runs.assign(final_accuracy=np.nan, time_to_target_s=np.nan)
    shown = format_summary(summary_table(regression))
    assert not any(c.startswith(("time to target", "reached")) for c in shown)
    assert "final test accuracy" not in shown and "final test loss" in shown
