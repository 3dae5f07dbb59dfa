"""When θ is snapshotted for evaluation: at version 0, every `eval.every_updates` updates
and/or every `eval.every_s` seconds, and at the end. The real runtime takes θ at the first
update at or past a due time; the simulator evaluates θ as of each grid time k·every_s (the
version applied last at or before it). The expected snapshots are computed here from the
update events alone."""

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


def on_grid(run, every: float) -> list[tuple[float, int]]:
    """What the simulator must evaluate: each grid time k·every up to the end, with the
    version of the last update at or before it, then the end itself."""
    t_end, v_end = end(run)
    ups = updates(run)
    expected, k = [], 0
    while round(k * every, 9) <= t_end:
        g = round(k * every, 9)
        expected.append((g, max((v for t, v in ups if t <= g), default=0)))
        k += 1
    if expected[-1][0] != t_end:
        expected.append((t_end, v_end))
    return expected


@pytest.mark.timeout(120)
def test_sim_snapshots_every_s_of_virtual_time(tmp_path):
    run = run_job(
        tmp_path,
        ["runtime=sim", "algorithm=asp", "budget.max_wall_s=1.0", "eval.every_s=0.25",
         "eval.every_updates=0", "eval.train_samples=0"],
    )  # fmt: skip
    assert snapshots(run) == on_grid(run, 0.25)
    assert [t for t, _ in snapshots(run)] == [0.0, 0.25, 0.5, 0.75, 1.0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "overrides",
    [
        # BSP on a heterogeneous cluster: a round waits for the 3x slower worker, 3 x 0.2 s
        ["algorithm=bsp", "cluster.compute_ms=200", "cluster.slowdown=[1,3]"],
        # DiLoCo: 5 inner steps of 0.1 s (0.2 s on the slow worker) per round
        ["algorithm=diloco", "algorithm.outer.inner_steps=5", "cluster.compute_ms=100",
         "cluster.slowdown=[1,2]", "algorithm/inner=sgd"],
    ],
    ids=["bsp-heterogeneous", "diloco"],
)  # fmt: skip
def test_sim_rounds_longer_than_every_s_are_read_on_the_grid(tmp_path, overrides):
    run = run_job(
        tmp_path,
        ["runtime=sim", "cluster.num_workers=2", "budget.max_updates=0", "budget.max_wall_s=2.5",
         "eval.every_s=0.25", "eval.every_updates=0", "eval.train_samples=0", *overrides],
    )  # fmt: skip
    ups = updates(run)
    rounds = [b - a for (a, _), (b, _) in zip(ups, ups[1:], strict=False)]
    assert len(ups) >= 3 and min(rounds) > 0.25  # every round spans more than one grid step
    snaps = snapshots(run)
    assert snaps == on_grid(run, 0.25)
    grid = [t for t, _ in snaps if t != end(run)[0]]
    assert grid == [k * 0.25 for k in range(len(grid))] and len(grid) >= 10  # 0, 0.25, ... 2.5
    # one evaluation per θ: grid times between two updates report the same numbers
    by_version: dict[int, set] = {}
    for e in run.events:
        if e["kind"] == "eval":
            by_version.setdefault(e["version"], set()).add(e["loss"])
    assert all(len(losses) == 1 for losses in by_version.values())


@pytest.mark.timeout(120)
def test_sim_grid_snapshots_are_byte_identical_for_a_seed(tmp_path):
    overrides = ["runtime=sim", "algorithm=bsp", "cluster.slowdown=[1,1,2,3]",
                 "budget.max_wall_s=0.5", "eval.every_s=0.03", "eval.every_updates=0"]  # fmt: skip
    a = run_job(tmp_path / "a", overrides)
    b = run_job(tmp_path / "b", overrides)
    assert len(snapshots(a)) >= 10
    assert (a.dir / "events.jsonl").read_bytes() == (b.dir / "events.jsonl").read_bytes()


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
