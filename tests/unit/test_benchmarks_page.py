"""docs/benchmarks.md is what benchmarks/results/ render to: a figure changes in a result
file, never by hand on the page."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from benchmarks import render

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_page_is_what_the_results_render_to():
    assert render.PAGE.read_text() == render.render(), "run python -m benchmarks.render"


def test_a_figure_on_the_page_comes_from_its_result_file(tmp_path):
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    shutil.copy(ROOT / "benchmarks" / "results" / "baselines.json", results)
    data = json.loads((results / "baselines.json").read_text())
    data["figures"]["allreduce_bsp_2/cnn"]["ratio_median"] = 0.4321
    (results / "baselines.json").write_text(json.dumps(data))
    page = render.render(tmp_path)
    row = next(line for line in page.splitlines() if "`allreduce_bsp_2/cnn`" in line)
    assert "| 0.43 |" in row and "≥ 0.98" in row
    assert "Overlapping communication" not in page  # no result file, no section
