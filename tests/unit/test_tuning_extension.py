"""The tuning protocol's edge extension (stalebench.tuning): a grid axis's own ratio, the
point beyond an edge, the pure decision of what to try next and when to stop, its record
in tuning.json from run directories written by hand, and the equal-resolution check."""

from __future__ import annotations

import pytest

from stalebench import tuning
from stalebench.errors import ConfigError
from stalebench.sweep import TuneConfig
from tests.unit.test_tuning_selection import write_run

LR = "algorithm.update.lr"
OUTER = "algorithm.outer.lr"


@pytest.mark.parametrize(
    "values, expected",
    [
        ([0.025, 0.05, 0.1, 0.2], 2.0),
        ([0.4, 0.00002], 20000.0),  # sorted first: the grid's order does not matter
        ([0.0015, 0.003, 0.006, 0.012], 2.0),  # 0.006/0.003 is 2 only to rounding
        ([32, 64, 128], 2.0),
        ([0.025, 0.1, 0.2], None),  # ×4 then ×2: not geometric
        ([0.5, 1.0, 1.5], None),  # linear
        ([0.1], None),  # one point: no ratio
        (["adam", "sgd"], None),
        ([True, False], None),
        ([0.0, 0.1], None),
        ([-0.1, -0.2], None),
        ([0.1, 0.1], None),
    ],
)
def test_an_axis_ratio_is_its_adjacent_points_ratio_when_geometric(values, expected):
    got = tuning.ratio(values)
    assert got == (None if expected is None else pytest.approx(expected))


def test_the_point_beyond_an_edge_is_one_ratio_away_and_reads_as_written():
    assert tuning.beyond([0.025, 0.05, 0.1, 0.2], 0.2, "top") == 0.4
    assert tuning.beyond([0.025, 0.05, 0.1, 0.2], 0.025, "bottom") == 0.0125
    assert tuning.beyond([0.00001, 0.2], 0.2, "top") == 4000.0
    assert tuning.beyond([0.025, 0.1, 0.4, 1.6], 1.6, "top") == 6.4
    assert tuning.beyond([32, 64], 64, "top") == 128 and isinstance(
        tuning.beyond([32, 64], 64, "top"), int
    )
    assert tuning.beyond([2, 3], 2, "bottom") is None  # 4/3 is no integer
    assert tuning.beyond([0.5, 1.0, 1.5], 1.5, "top") is None  # not geometric


GRID = {LR: [0.05, 0.1, 0.2]}
POINTS = tuning.grid(GRID)


def decide(params, points, dead, best, left=4):
    return tuning.extension(params, points, dead, best, left)


def test_an_interior_best_stops_at_once():
    d = decide(GRID, POINTS, [False] * 3, best=1)
    assert (d.next, d.stopped, d.at_edge) == (None, "interior", [])


def test_a_best_at_the_top_edge_tries_the_point_above():
    d = decide(GRID, POINTS, [False] * 3, best=2)
    assert (d.next, d.key, d.side, d.stopped, d.at_edge) == ({LR: 0.4}, LR, "top", None, [LR])


def test_a_best_at_the_bottom_edge_tries_the_point_below():
    d = decide(GRID, POINTS, [False] * 3, best=0)
    assert (d.next, d.side) == ({LR: 0.025}, "bottom")


def test_a_worse_point_beyond_makes_the_edge_interior():
    d = decide(GRID, [*POINTS, {LR: 0.4}], [False] * 4, best=2)
    assert (d.next, d.stopped) == (None, "interior")


def test_a_better_point_beyond_goes_on_beyond_it():
    d = decide(GRID, [*POINTS, {LR: 0.4}], [False] * 4, best=3)
    assert (d.next, d.side) == ({LR: 0.8}, "top")


def test_a_point_beyond_dead_on_every_seed_makes_the_edge_interior_by_definition():
    d = decide(GRID, [*POINTS, {LR: 0.4}], [False, False, False, True], best=2)
    assert (d.next, d.stopped, d.at_edge) == (None, "diverged", [])


def test_the_cap_stops_a_best_still_at_the_edge():
    points = [*POINTS, {LR: 0.4}, {LR: 0.8}]
    d = decide(GRID, points, [False] * 5, best=4, left=0)
    assert (d.next, d.stopped, d.at_edge) == (None, "cap", [LR])
    assert decide(GRID, POINTS, [False] * 3, best=2, left=0).stopped == "cap"


def test_a_non_geometric_axis_is_never_extended_and_says_so():
    params = {LR: [0.05, 0.1, 0.3]}
    d = decide(params, tuning.grid(params), [False] * 3, best=2)
    assert (d.next, d.stopped, d.at_edge) == (None, "not_geometric", [LR])


def test_a_non_numeric_axis_has_no_edge():
    params = {"algorithm.optimizer.name": ["adam", "sgd"]}
    d = decide(params, tuning.grid(params), [False, False], best=1)
    assert (d.next, d.stopped) == (None, "interior")


def test_each_axis_is_extended_along_the_best_points_line():
    params = {LR: [0.1, 0.2], OUTER: [0.5, 1.0]}
    points = tuning.grid(params)  # (0.1, 0.5) (0.1, 1.0) (0.2, 0.5) (0.2, 1.0)
    # best (0.2, 0.5): the top of LR, the bottom of OUTER; LR first (the grid's key order)
    d = decide(params, points, [False] * 4, best=2)
    assert (d.next, d.key, d.side) == ({LR: 0.4, OUTER: 0.5}, LR, "top")
    # the point above diverged: LR is closed, OUTER's bottom edge is next
    points.append({LR: 0.4, OUTER: 0.5})
    d = decide(params, points, [False] * 4 + [True], best=2)
    assert (d.next, d.key, d.side) == ({LR: 0.2, OUTER: 0.25}, OUTER, "bottom")
    assert d.at_edge == [OUTER]


def test_a_point_beyond_that_failed_on_one_seed_only_is_not_dead(tmp_path):
    """Dead means every tuning run failed or diverged; one completed run keeps the point
    alive (it ranks after the best, so the edge is interior, not closed by divergence)."""
    tune = TuneConfig(params={LR: [0.1, 0.2]}, seeds=[1000, 1001])
    cell = {"overrides": ["+sweep/arms/x=a"], "arm": "a", "params": tune.params}
    for j, loss in enumerate([0.5, 0.3]):
        for s in tune.seeds:
            write_run(tmp_path, tuning.run_dir(0, j, s), final_loss=loss)
    (first,) = tuning.record(tune, [cell], tmp_path)["cells"]
    assert first["extension"]["next"] == {"values": {LR: 0.4}, "key": LR, "side": "top"}
    write_run(tmp_path, tuning.run_dir(0, 2, 1000), status="diverged", final_loss=None)
    write_run(tmp_path, tuning.run_dir(0, 2, 1001), final_loss=0.2)
    (cell_,) = tuning.record(tune, [cell], tmp_path, [[first["extension"]["next"]]])["cells"]
    assert cell_["selected"] == {LR: 0.2} and cell_["extension"]["stopped"] == "interior"


def extended_to_divergence(tmp_path):
    """A cell with the grid {0.1, 0.2} and two points above it run: 0.1 < 0.2 < 0.4 (each
    better), 0.8 diverged; selected 0.4, interior by definition. Its tune block and cell."""
    tune = TuneConfig(params={LR: [0.1, 0.2]}, seeds=[1000], max_extensions=3)
    cell = {"overrides": ["+sweep/arms/x=a"], "arm": "a", "params": tune.params}
    for j, (status, loss) in enumerate(
        [("completed", 0.5), ("completed", 0.3), ("completed", 0.2), ("diverged", None)]
    ):
        write_run(tmp_path, tuning.run_dir(0, j, 1000), status=status, final_loss=loss)
    return tune, cell


def test_tuning_json_records_the_extension_and_each_arms_points(tmp_path):
    tune, cell = extended_to_divergence(tmp_path)
    added: list[dict] = []
    while "next" in (c := tuning.record(tune, [cell], tmp_path, [added])["cells"][0])["extension"]:
        added.append(c["extension"]["next"])
    content = tuning.record(tune, [cell], tmp_path, [added])
    (record,) = content["cells"]
    assert record["selected"] == {LR: 0.4} and record["selected_candidate"] == 2
    assert record["extension"] == {
        "ratio": {LR: 2.0},
        "added": [
            {"candidate": 2, "key": LR, "side": "top", "values": {LR: 0.4}},
            {"candidate": 3, "key": LR, "side": "top", "values": {LR: 0.8}},
        ],
        "stopped": "diverged",
        "at_edge": [],
    }
    assert (record["points"], record["budget"]) == (4, 4)
    assert record["candidates"][3]["runs"][0]["dir"] == "tune/0/3/1000"
    assert (content["budget"], content["max_extensions"], content["points"]) == (2, 3, {"a": [4]})


def test_the_cap_is_recorded_as_still_at_the_edge(tmp_path):
    tune = TuneConfig(params={LR: [0.1, 0.2]}, seeds=[1000], max_extensions=1)
    cell = {"overrides": [], "arm": None, "params": tune.params}
    for j, loss in enumerate([0.5, 0.3, 0.2]):  # the point above is better still
        write_run(tmp_path, tuning.run_dir(0, j, 1000), final_loss=loss)
    added = [{"values": {LR: 0.4}, "key": LR, "side": "top"}]
    (record,) = tuning.record(tune, [cell], tmp_path, added=[added])["cells"]
    assert record["selected"] == {LR: 0.4}
    assert (record["extension"]["stopped"], record["extension"]["at_edge"]) == ("cap", [LR])
    assert "next" not in record["extension"]


def cells(**grids):
    return [{"overrides": [], "arm": arm, "params": grid} for arm, grid in grids.items()]


def test_arms_at_one_resolution_pass():
    got = tuning.check_resolution(
        cells(asp={LR: [0.05, 0.1, 0.2]}, dc={LR: [0.0025, 0.005, 0.01]}, none={})
    )
    assert got == {"asp": [pytest.approx(2.0)], "dc": [pytest.approx(2.0)]}
    # one grid for every arm, whatever its axes' ratios (diloco_async: ×4 and ×2)
    tuning.check_resolution(cells(a={LR: [0.002, 0.008], OUTER: [0.5, 1.0]}))


@pytest.mark.parametrize(
    "grids, shown",
    [
        ({"ssp": {LR: [0.025, 0.1, 0.4]}, "bsp": {LR: [0.1, 0.2, 0.4]}}, "ssp x4; bsp x2"),
        (
            {"sync": {LR: [0.002, 0.008]}, "h10": {LR: [0.002, 0.008], OUTER: [0.5, 1.0]}},
            "sync x4; h10 x2, x4",
        ),  # fmt: skip
        ({"a": {LR: [0.1, 0.2]}, "b": {LR: [0.1, 0.2, 0.5]}}, "b none (not geometric)"),
    ],
)
def test_arms_at_different_resolutions_are_refused_naming_each(grids, shown):
    with pytest.raises(ConfigError, match="sweep.tune") as err:
        tuning.check_resolution(cells(**grids))
    assert shown in str(err.value) and "\n" not in str(err.value)


def test_max_extensions_is_checked_by_its_key():
    for bad in (-1, 65, True):
        with pytest.raises(ConfigError, match=r"sweep\.tune\.max_extensions"):
            TuneConfig(params={LR: [0.1]}, max_extensions=bad)
    assert TuneConfig().max_extensions == 4


def test_the_report_shows_each_cells_points_and_extension(tmp_path):
    from stalebench.report.results import tuning_summary

    tune, cell = extended_to_divergence(tmp_path)
    added = [
        {"values": {LR: 0.4}, "key": LR, "side": "top"},
        {"values": {LR: 0.8}, "key": LR, "side": "top"},
    ]
    content = tuning.record(tune, [cell], tmp_path, [added])
    text = "\n".join(tuning_summary(content))
    assert "max_extensions: 3" in text and "points: a 4" in text
    (row,) = [line for line in text.splitlines() if "+sweep/arms/x=a" in line or "| a " in line]
    assert "0.4 |" in row and "(edge)" not in row  # interior by definition: no edge mark
    assert "+0.4, 0.8 (interior: failed or diverged beyond)" in row
    # a tuning.json from before the extension renders as it did (the committed results)
    for c in content["cells"]:
        del c["extension"]
    header = "| cell | grid | selected | score (final_loss) | standing |"
    assert header in tuning_summary(content)[2]
