"""When θ is snapshotted for evaluation: at version 0, every `eval.every_updates` updates
and/or every `eval.every_s` seconds (the first update at or past the due time), and at
the end. The expected snapshots are computed here from the update events alone."""

from __future__ import annotations

import pytest

from tests.conftest import run_job


def snapshots(run) -> list[tuple[float, int]]:
    return [
        (e["t"], e["version"]) for e in run.events if e["kind"] == "eval" and e["split"] == "test"
    ]


def updates(run) -> list[tuple[float, int]]:
    """(time, version) of each update, once per version."""
    seen, out = set(), []
    for e in run.events:
        if e["kind"] == "update" and e["version"] not in seen:
            seen.add(e["version"])
            out.append((e["t"], e["version"]))
    return out


def end(run) -> tuple[float, int]:
    (e,) = [e for e in run.events if e["kind"] == "system" and e["event"] == "end"]
    return e["t"], e["updates"]


@pytest.mark.timeout(120)
def test_sim_snapshots_every_s_of_virtual_time(tmp_path):
    run = run_job(
        tmp_path,
        ["runtime=sim", "algorithm=asp", "budget.max_wall_s=1.0", "eval.every_s=0.25",
         "eval.every_updates=0", "eval.train_samples=0"],
    )  # fmt: skip
    expected, due = [(0.0, 0)], 0.25
    for t, v in updates(run):
        if t >= due:
            expected.append((t, v))
            due = t + 0.25
    expected.append(end(run))
    assert snapshots(run) == expected
    assert len(expected) >= 5  # 1 s of virtual time: four due times and the start


@pytest.mark.timeout(120)
def test_sim_snapshots_every_n_updates(tmp_path):
    run = run_job(
        tmp_path,
        ["runtime=sim", "algorithm=ssp", "budget.max_updates=130", "eval.every_s=0",
         "eval.every_updates=50", "eval.train_samples=0"],
    )  # fmt: skip
    assert [v for _, v in snapshots(run)] == [0, 50, 100, 130]
    times = dict((v, t) for t, v in updates(run))
    assert [t for t, _ in snapshots(run)][1:3] == [times[50], times[100]]


@pytest.mark.timeout(120)
def test_real_snapshots_every_s_of_wall_time(tmp_path):
    every = 0.3
    run = run_job(
        tmp_path,
        ["algorithm=asp", "budget.max_wall_s=2.0", f"eval.every_s={every}",
         "eval.every_updates=0", "eval.train_samples=0"],
    )  # fmt: skip
    snaps, ups = snapshots(run), updates(run)
    assert snaps[0] == (0.0, 0) and snaps[-1][1] == end(run)[1]
    assert len(snaps) >= 4  # 2 s of training, one due every 0.3 s
    for (t0, _), (t1, v1) in zip(snaps[:-2], snaps[1:-1], strict=True):
        assert t1 >= t0 + every
        # the snapshot follows the first update due after t0 + every: no other update
        # happened between that due time and the snapshot
        between = [v for t, v in ups if t0 + every <= t < t1]
        assert between in ([], [v1]), (t0, t1, between)
