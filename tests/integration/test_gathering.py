"""Barriers that gather several gradients into one update, in the simulator (real gradients
on the virtual clock): BSP with backup workers (Chen et al. 2016) and GBA (Su et al. 2022),
against their definitions and the reductions to BSP."""

from __future__ import annotations

import pytest
import torch

from stalebench.errors import ConfigError
from tests.conftest import compose, fast_with, run_job

SIM = ["runtime=sim", "cluster.num_workers=4", "budget.max_updates=40", "algorithm.update.lr=0.05"]
SKEWED = ["cluster=heterogeneous", "cluster.compute_ms=5"]  # half the workers 2-3x slower


def final(run) -> dict[str, torch.Tensor]:
    return torch.load(run.dir / "model.pt")


def same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def updates(events):
    return [e for e in events if e["kind"] == "update"]


def dropped(events):
    return [e for e in events if e["kind"] == "barrier" and e["event"] == "dropped"]


@pytest.mark.timeout(60)
def test_zero_backups_is_bsp_bit_for_bit(tmp_path):
    """bsp (gathered by the round it read) against ssp(0) per round (gathered by clock),
    and against engine=allreduce: one trajectory, on a skewed cluster."""
    runs = [
        run_job(tmp_path / "b0", ["algorithm=bsp", "algorithm.barrier.backups=0", *SKEWED, *SIM]),
        run_job(
            tmp_path / "ssp0",
            [
                "algorithm=ssp",
                "algorithm.barrier.staleness=0",
                "algorithm.barrier.apply=per_round",
                *SKEWED,
                *SIM,
            ],
        ),  # fmt: skip
        run_job(tmp_path / "ar", ["algorithm=bsp", "engine=allreduce", *SKEWED, *SIM]),
    ]
    assert runs[0].summary["updates"] == 40
    assert same(final(runs[0]), final(runs[1])) and same(final(runs[0]), final(runs[2]))
    assert updates(runs[0].events) == updates(runs[1].events)
    assert not dropped(runs[0].events)


@pytest.mark.timeout(60)
def test_backups_apply_the_first_n_minus_b_and_drop_the_rest(tmp_path):
    run = run_job(tmp_path, ["algorithm=bsp_backup", *SKEWED, *SIM])
    assert run.summary["status"] == "completed"
    ups = updates(run.events)
    by_version: dict[int, list[dict]] = {}
    for e in ups:
        by_version.setdefault(e["version"], []).append(e)
    assert len(by_version) == 40
    assert all(len(v) == 3 and all(e["lag"] == 0 for e in v) for v in by_version.values())
    drops = dropped(run.events)
    assert drops  # the slow half's gradients arrive after their round was applied
    assert all(d["lag"] >= 1 for d in drops)
    # a worker dropped from round v is in none of round v's updates, and its next gradient
    # is computed on the θ it reads after the drop (an update event with lag 0 again)
    for d in drops:
        round_ = d["version"] - d["lag"] + 1  # the update its gradient missed
        assert d["worker"] not in {e["worker"] for e in by_version[round_]}
    # every worker's clocks stay consecutive: applied or dropped, each step is accounted for
    for w in range(4):
        clocks = sorted(e["clock"] for e in ups + drops if e["worker"] == w)
        assert clocks == list(range(len(clocks)))


@pytest.mark.timeout(60)
def test_backups_finish_rounds_sooner_under_stragglers(tmp_path):
    args = ["cluster=stragglers", "cluster.compute_ms=5", "cluster.straggler_prob=0.2", *SIM]
    bsp = run_job(tmp_path / "bsp", ["algorithm=bsp", *args]).summary
    b1 = run_job(tmp_path / "b1", ["algorithm=bsp_backup", *args]).summary
    assert b1["updates"] == bsp["updates"] == 40
    assert b1["run_time_s"] < 0.8 * bsp["run_time_s"]


@pytest.mark.timeout(60)
def test_gba_waiting_for_its_round_with_one_round_of_global_batch_is_bsp(tmp_path):
    """ahead = 0 and a global batch of N gradients: every worker waits for the update its
    gradient is in, so no gradient is stale and GBA is BSP, bit for bit."""
    gba = ["algorithm=gba", "algorithm.barrier.ahead=0", "algorithm.barrier.global_batch=0"]
    runs = [
        run_job(tmp_path / "gba", [*gba, *SKEWED, *SIM]),
        run_job(tmp_path / "bsp", ["algorithm=bsp", *SKEWED, *SIM]),
    ]
    assert same(final(runs[0]), final(runs[1]))
    assert updates(runs[0].events) == updates(runs[1].events)


@pytest.mark.timeout(60)
def test_gba_gathers_the_global_batch_from_the_fastest_and_drops_the_stale(tmp_path):
    run = run_job(tmp_path, ["algorithm=gba", "algorithm.barrier.global_batch=6", *SKEWED, *SIM])
    ups = updates(run.events)
    per_version: dict[int, int] = {}
    for e in ups:
        per_version[e["version"]] = per_version.get(e["version"], 0) + 1
    assert set(per_version.values()) == {6}  # each update: the global batch, whoever made it
    assert all(e["lag"] <= 2 for e in ups)  # the token rule: beyond 2 stale, dropped
    assert all(d["lag"] > 2 for d in dropped(run.events))
    counts = [sum(e["worker"] == w for e in ups) for w in range(4)]
    assert max(counts) > min(counts)  # the fast workers fill more of the global batch


def test_gba_weighs_by_the_token_rule():
    from stalebench.algorithms.base import BARRIERS

    cfg = compose(
        fast_with(["algorithm=gba", "algorithm.barrier.decay=0.5", "budget.max_updates=9"])
    ).algorithm.barrier
    gba = BARRIERS.build(cfg, 4, 0)
    assert [gba.weigh(lag) for lag in range(6)] == [1, 1, 1, 0.5, 0.25, 0.125]
    assert gba.quorum(3) == 4  # the global batch, whoever is lost
    assert gba.admit_gathered(True, 100, 100)  # ahead = -1: never wait
    cfg.ahead = 0
    assert gba.admit_gathered(False, 1, 2) and not gba.admit_gathered(False, 1, 3)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.barrier.backups=4"], "algorithm.barrier.backups=4 with cluster.num_workers=4"),
        (["algorithm.barrier.backups=-1"], "algorithm.barrier.backups must be >= 0, got -1"),
        (
            ["algorithm.barrier.backups=1", "engine=allreduce"],
            "algorithm.barrier=bsp with backups=1 needs each gradient on its own",
        ),
    ],
)
def test_bad_backups_are_refused_by_name(tmp_path, overrides, message):
    from stalebench import experiment

    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        cfg = compose(
            fast_with(
                ["algorithm=bsp", "cluster.num_workers=4", "budget.max_updates=9", *overrides]
            )
        )
        cfg.run_dir = str(tmp_path)
        experiment.run(cfg)


@pytest.mark.timeout(60)
def test_dbs_with_equal_speeds_is_bsp_bit_for_bit(tmp_path):
    args = ["cluster=homogeneous", "cluster.compute_ms=5", *SIM]
    runs = [
        run_job(tmp_path / "dbs", ["algorithm=dbs", "algorithm.barrier.rebalance_every=5", *args]),
        run_job(tmp_path / "bsp", ["algorithm=bsp", *args]),
    ]
    shares = [e for e in runs[0].events if e["kind"] == "barrier" and e["event"] == "rebalance"]
    assert len(shares) == 8 and all(e["batch_sizes"] == [32] * 4 for e in shares)
    assert same(final(runs[0]), final(runs[1]))
    assert updates(runs[0].events) == updates(runs[1].events)


@pytest.mark.timeout(60)
def test_dbs_gives_the_fast_workers_more_of_the_global_batch(tmp_path):
    """A worker 3x slower than the others gets about a third of their share; the global
    batch stays 4 x 32, and every worker's step then lasts about as long."""
    args = ["cluster=homogeneous", "cluster.compute_ms=5", "cluster.slowdown=[1,1,1,3]", *SIM]
    run = run_job(tmp_path, ["algorithm=dbs", "algorithm.barrier.rebalance_every=5", *args])
    shares = [e for e in run.events if e["kind"] == "barrier" and e["event"] == "rebalance"]
    first = shares[0]
    assert sum(first["batch_sizes"]) == 128
    assert first["batch_sizes"] == [39, 38, 38, 13]  # 128 · (.3, .3, .3, .1), rounded
    rates = first["samples_per_s"]
    assert rates[0] == pytest.approx(3 * rates[3])
    late = [e for e in updates(run.events) if e["version"] > 5]
    steps = [[e["compute_s"] for e in late if e["worker"] == w] for w in range(4)]
    assert max(steps[3]) < 1.1 * min(steps[0])  # no longer 3x: the round waits for nobody
    bsp = run_job(tmp_path / "bsp", ["algorithm=bsp", *args]).summary
    assert run.summary["run_time_s"] < 0.6 * bsp["run_time_s"]


def test_dbs_on_small_shards_is_refused_by_name(tmp_path):
    from stalebench import experiment

    with pytest.raises(ConfigError, match="algorithm.barrier.rebalance_every=10 may give"):
        args = ["algorithm=dbs", "cluster.num_workers=16", "budget.max_updates=9"]
        cfg = compose(fast_with([*args, "dataset.sharding=disjoint", "dataset.batch_size=64"]))
        cfg.run_dir = str(tmp_path)
        experiment.run(cfg)


def test_proportional_sizes_keep_the_total():
    from stalebench.algorithms.barriers import proportional

    assert proportional(128, [3, 3, 3, 1]) == [39, 38, 38, 13]
    assert proportional(128, [1.0] * 4) == [32] * 4
    assert proportional(10, [1000, 1, 1]) == [8, 1, 1]  # never below one sample
    for rates in ([0.3, 7, 2.2], [1e-6, 1, 1, 1, 5], [2] * 7):
        assert sum(proportional(100, rates)) == 100 and min(proportional(100, rates)) >= 1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algorithm=dbs", "algorithm.barrier.rebalance_every=-1"],
            "algorithm.barrier.rebalance_every must be >= 0, got -1",
        ),
        (
            ["algorithm=dbs", "engine=allreduce"],
            "algorithm.barrier=bsp with rebalance_every=10 needs each gradient weighed",
        ),
        (["algorithm=gba", "algorithm.barrier.decay=2"], "algorithm.barrier.decay must be in"),
        (["algorithm=gba", "algorithm.barrier.ahead=-2"], "algorithm.barrier.ahead must be >= -1"),
        (["algorithm=sgp", "engine.sync_every=0"], "engine.sync_every must be >= 1, got 0"),
        (
            ["algorithm=sgp", "algorithm.inner.reset=true"],
            "algorithm.inner=momentum with reset=true needs rounds",
        ),
    ],
)
def test_bad_gathering_and_gossip_settings_are_refused_by_name(tmp_path, overrides, message):
    from stalebench import experiment

    with pytest.raises(ConfigError, match=message):
        cfg = compose(fast_with(["cluster.num_workers=4", "budget.max_updates=9", *overrides]))
        cfg.run_dir = str(tmp_path)
        experiment.run(cfg)
