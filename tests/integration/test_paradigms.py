"""Issue-level behaviour of every paradigm, end to end: the invariants of docs/algorithms.md §12
on whole runs (the sim runtime is deterministic, so equal algorithms give equal runs), the
DSSP threshold range, PSP's gaps against β, and allreduce BSP against PS-BSP."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import FAST, run_job

SIM = [
    "runtime=sim",
    "cluster.num_workers=4",
    "cluster.slowdown=[1,1,2.5,3]",
    "budget.max_updates=80",
]


def sim(tmp_path, name, *overrides):
    return run_job(tmp_path / name, [*SIM, *overrides])


def same_run(a, b):
    """Same updates in the same order on the same parameters, and the same final θ."""
    key = ("worker", "clock", "version", "lag", "loss")
    ua = [tuple(e[k] for k in key) for e in a.events if e["kind"] == "update"]
    ub = [tuple(e[k] for k in key) for e in b.events if e["kind"] == "update"]
    assert ua == ub
    pa, pb = torch.load(a.dir / "model.pt"), torch.load(b.dir / "model.pt")
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


@pytest.mark.timeout(60)
def test_ssp_with_infinite_staleness_is_asp(tmp_path):
    same_run(
        sim(tmp_path, "asp", "algorithm=asp"),
        sim(tmp_path, "ssp", "algorithm=ssp", "algorithm.barrier.staleness=1000000"),
    )


@pytest.mark.timeout(60)
def test_ssp_zero_per_round_is_bsp(tmp_path):
    same_run(
        sim(tmp_path, "bsp", "algorithm=bsp"),
        sim(
            tmp_path,
            "ssp",
            "algorithm=ssp",
            "algorithm.barrier.staleness=0",
            "algorithm.barrier.apply=per_round",
        ),
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("s", [0, 2])
def test_dssp_with_an_empty_range_is_ssp(tmp_path, s):
    same_run(
        sim(tmp_path, "ssp", "algorithm=ssp", f"algorithm.barrier.staleness={s}"),
        sim(
            tmp_path,
            "dssp",
            "algorithm=dssp",
            f"algorithm.barrier.s_low={s}",
            f"algorithm.barrier.s_high={s}",
        ),
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("s", [0, 2])
def test_psp_sampling_every_peer_is_ssp_and_sampling_none_is_asp(tmp_path, s):
    same_run(
        sim(tmp_path, "ssp", "algorithm=ssp", f"algorithm.barrier.staleness={s}"),
        sim(
            tmp_path,
            "psp",
            "algorithm=psp",
            f"algorithm.barrier.staleness={s}",
            "algorithm.barrier.sample_size=3",
        ),
    )
    same_run(
        sim(tmp_path, "asp", "algorithm=asp"),
        sim(tmp_path, "psp0", "algorithm=psp", "algorithm.barrier.sample_size=0"),
    )


@pytest.mark.timeout(60)
def test_dana_slim_computes_every_gradient_where_dana_zero_does(tmp_path):
    common = ["algorithm=dana", "algorithm.update.lr=0.05", "algorithm.update.momentum=0.9"]
    zero = sim(tmp_path, "zero", *common, "algorithm.update.variant=zero")
    slim = sim(tmp_path, "slim", *common, "algorithm.update.variant=slim")
    lz = [e["loss"] for e in zero.events if e["kind"] == "update"]
    ls = [e["loss"] for e in slim.events if e["kind"] == "update"]
    assert len(lz) == len(ls) == 80
    torch.testing.assert_close(torch.tensor(ls), torch.tensor(lz), rtol=1e-4, atol=1e-5)


@pytest.mark.timeout(60)
def test_dana_without_momentum_is_asgd(tmp_path):
    asgd = sim(tmp_path, "asgd", "algorithm=asp")
    dana = sim(
        tmp_path, "dana", "algorithm=dana", "algorithm.update.momentum=0", "algorithm.update.lr=0.1"
    )
    pa, pb = torch.load(asgd.dir / "model.pt"), torch.load(dana.dir / "model.pt")
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], rtol=0, atol=1e-6)


@pytest.mark.timeout(60)
def test_dssp_threshold_stays_within_its_range(tmp_path):
    run = sim(
        tmp_path,
        "dssp",
        "algorithm=dssp",
        "algorithm.barrier.s_low=1",
        "algorithm.barrier.s_high=4",
        "budget.max_updates=200",
    )
    gaps = [e["clock_gap"] for e in run.events if e["kind"] == "update"]
    assert max(gaps) <= 4 and max(gaps) > 1  # grants happened, the bound held
    grants = [e for e in run.events if e["kind"] == "barrier" and e["event"] == "dssp_grant"]
    assert grants and all(0 <= g["extra"] <= 3 for g in grants)


@pytest.mark.timeout(120)
def test_psp_gaps_shrink_as_the_sample_grows(tmp_path):
    n = 8
    mean_gap = {}
    for beta in (0, 1, 2, n - 1):
        run = run_job(
            tmp_path / f"b{beta}",
            [
                "runtime=sim",
                f"cluster.num_workers={n}",
                "cluster.slowdown=[1,1,1,1,2,2,3,3]",
                "budget.max_updates=400",
                "algorithm=psp",
                f"algorithm.barrier.sample_size={beta}",
            ],
        )
        gaps = [e["clock_gap"] for e in run.events if e["kind"] == "update"]
        mean_gap[beta] = sum(gaps) / len(gaps)
    betas = sorted(mean_gap)
    assert all(mean_gap[a] >= mean_gap[b] for a, b in zip(betas, betas[1:], strict=False))
    assert mean_gap[0] > 2 * mean_gap[n - 1], mean_gap


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_allreduce_bsp_reaches_the_parameters_of_ps_bsp(tmp_path):
    common = [
        *FAST,
        "algorithm=bsp",
        "cluster.num_workers=3",
        "budget.max_updates=20",
        "algorithm/update=momentum",
    ]
    ps = run_job(tmp_path / "ps", common)
    ar = run_job(tmp_path / "ar", [*common, "engine=allreduce"])
    assert ps.summary["status"] == ar.summary["status"] == "completed"
    assert ar.summary["engine"] == "allreduce" and ar.summary["updates"] == 20
    pa, pb = torch.load(ps.dir / "model.pt"), torch.load(ar.dir / "model.pt")
    for k in pa:  # the same up to the all-reduce's summation order
        torch.testing.assert_close(pa[k], pb[k], rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(60)
def test_any_barrier_composes_with_any_update_rule(tmp_path):
    run = sim(
        tmp_path,
        "ssp_ga",
        "algorithm/barrier=ssp",
        "algorithm/update=gap_aware",
        "algorithm.update.momentum=0.9",
        "algorithm.update.lr=0.05",
    )
    assert run.summary["status"] == "completed"
    assert (run.summary["algorithm"], run.summary["barrier"], run.summary["update_rule"]) == (
        "ssp+gap_aware",
        "ssp",
        "gap_aware",
    )
    assert run.summary["parts"] == {"barrier": "ssp", "update": "gap_aware"}
    assert run.summary["max_clock_gap"] <= 3


@pytest.mark.timeout(60)
def test_per_worker_rules_refuse_a_rounds_average(tmp_path):
    from stalebench.errors import ConfigError

    with pytest.raises(ConfigError, match="algorithm.update=dana .*per_round"):
        sim(tmp_path, "bsp_dana", "algorithm=bsp", "algorithm/update=dana")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "barrier, bound",
    [
        (["algorithm=ssp", "algorithm.barrier.staleness=3"], 3),
        (["algorithm=dssp"], 15),  # [s_low, s_high] = [3, 15]
    ],
    ids=["ssp3", "dssp3-15"],
)
def test_a_bounded_barrier_runs_at_the_slowest_pace_under_persistent_heterogeneity(
    tmp_path, barrier, bound
):
    """Why the SSP and DSSP sweeps find ASP faster on a heterogeneous cluster: once the fast
    workers are a full bound ahead, a bounded barrier lets them step only as often as the
    slowest worker does, whatever the bound; ASP's fast workers keep their own pace."""
    overrides = [
        "cluster.num_workers=2",
        "cluster.slowdown=[1,3]",
        "cluster.compute_ms=10",
        "budget.max_updates=0",
        "budget.max_wall_s=3",
    ]

    def late_steps(run):  # steps each worker pushed in the run's second half
        late = [e for e in run.events if e["kind"] == "update" and e["t"] > 1.5]
        return [sum(e["worker"] == w for e in late) for w in (0, 1)]

    fast, slow = late_steps(sim(tmp_path, "bounded", *barrier, *overrides))
    assert slow == 50  # 1.5 s at 30 ms a step
    # pinned to the slowest worker's pace: over any window the fast worker's lead can only
    # change by the bound (never 3× the steps, as it would at its own pace)
    assert abs(fast - slow) <= bound
    fast, slow = late_steps(sim(tmp_path, "asp", "algorithm=asp", *overrides))
    assert (fast, slow) == (150, 50)  # ASP: each at its own pace


@pytest.mark.timeout(60)
def test_a_network_delay_slows_asp_but_adds_no_staleness(tmp_path):
    """Why the SDDE sweep takes N, not a latency, as its staleness axis: every worker waits
    for its reply, so a delay on every push lengthens every round trip alike; the updates
    between a gradient's read and its application stay N − 1."""
    common = [
        "algorithm=asp",
        "cluster.num_workers=4",
        "cluster.slowdown=[1,1,1,1]",
        "cluster.compute_ms=10",
        "budget.max_updates=0",
        "budget.max_wall_s=2",
    ]
    fast = sim(tmp_path, "fast", *common, "cluster.push_latency_ms=0")
    slow = sim(tmp_path, "slow", *common, "cluster.push_latency_ms=30")
    assert fast.summary["lag"]["mean"] == pytest.approx(3.0, abs=0.05)
    assert slow.summary["lag"]["mean"] == pytest.approx(3.0, abs=0.05)
    assert slow.summary["updates"] < fast.summary["updates"] / 3  # 40 ms round trips, not 10
