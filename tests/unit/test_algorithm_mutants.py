"""Behaviour of the algorithms that the other unit tests left unpinned (found by mutation
testing): config boundaries and the exact refusal messages, the rule a per-worker error
names, DANA-Slim's weight decay on Φ, DSSP's controller choice, the slowest worker's interval,
its grant and safety-net counters, and PSP's first-check counters and default seed. Every
expected value is worked out by hand from docs/algorithms.md §5, §6, §8, §9, §11.1."""

import math

import pytest
import torch

from stalebench.algorithms.base import BARRIERS
from stalebench.algorithms.dana import (
    Dana,
    DanaConfig,
    DanaGapAware,
    DanaGapAwareConfig,
    MultiMomentum,
    MultiMomentumConfig,
)
from stalebench.algorithms.dssp import DSSP, DSSPConfig, GrantController, sync_controller
from stalebench.algorithms.psp import PSP, PSPConfig
from stalebench.algorithms.staleness import (
    DCASGD,
    DCASGDConfig,
    GapAware,
    GapAwareConfig,
    StalenessAwareConfig,
    worker_slot,
)
from stalebench.errors import ConfigError

# ---------------------------------------------------------------- config boundaries


@pytest.mark.parametrize(
    "build",
    [
        lambda: GapAwareConfig(name="gap_aware", beta=0.0),  # beta ∈ [0, 1): 0 is in
        lambda: DanaGapAwareConfig(name="dana_ga", beta=0.0),
        lambda: DCASGDConfig(name="dc_asgd", lam=0.0),  # lam, lam0 >= 0: 0 is in
        lambda: DCASGDConfig(name="dc_asgd", adaptive=True, lam0=0.0),
        lambda: DCASGDConfig(name="dc_asgd", ms_decay=0.0),  # ms_decay ∈ [0, 1): 0 is in
        lambda: DanaConfig(name="dana", variant="dc", dc_lambda=0.0),  # dc_lambda >= 0
    ],
)
def test_the_closed_end_of_each_range_is_accepted(build):
    build()  # raises ConfigError if the boundary is refused


@pytest.mark.parametrize(
    "build, message",
    [
        (
            lambda: GapAwareConfig(name="gap_aware", beta=-0.01),
            "algorithm.update.beta must be in [0, 1), got -0.01",
        ),
        (
            lambda: DanaGapAwareConfig(name="dana_ga", beta=1.0),
            "algorithm.update.beta must be in [0, 1), got 1.0",
        ),
        (
            lambda: DCASGDConfig(name="dc_asgd", lam=-0.01),
            "algorithm.update.lam must be finite and >= 0, got -0.01",
        ),
        (
            lambda: DCASGDConfig(name="dc_asgd", lam0=-0.01),
            "algorithm.update.lam0 must be finite and >= 0, got -0.01",
        ),
        (
            lambda: DCASGDConfig(name="dc_asgd", ms_decay=-0.01),
            "algorithm.update.ms_decay must be in [0, 1), got -0.01",
        ),
        (
            lambda: DCASGDConfig(name="dc_asgd", ms_decay=1.0),
            "algorithm.update.ms_decay must be in [0, 1), got 1.0",
        ),
        (
            lambda: DanaConfig(name="dana", dc_lambda=-0.01),
            "algorithm.update.dc_lambda must be finite and >= 0, got -0.01",
        ),
        (
            lambda: DanaConfig(name="dana", variant="lite"),
            "algorithm.update.variant must be one of zero, slim, dc, got 'lite'",
        ),
        (
            lambda: DanaGapAwareConfig(name="dana_ga", variant="slim"),
            "algorithm.update.variant=slim: dana_ga needs the server's per-worker buffers "
            "and look-aheads (variant zero or dc)",
        ),
        (
            lambda: StalenessAwareConfig(name="staleness_aware", nesterov=True),
            "algorithm.update.nesterov=True needs algorithm.update.momentum > 0, got momentum=0.0",
        ),
        (
            lambda: GapAwareConfig(name="gap_aware", nesterov=True),
            "algorithm.update.nesterov=True needs algorithm.update.momentum > 0, got momentum=0.0",
        ),
        (
            lambda: DSSPConfig(name="dssp", controller="merge"),
            "algorithm.barrier.controller must be 'next_push' or 'multi', got 'merge'",
        ),
    ],
)
def test_a_value_just_outside_is_refused_with_its_whole_message(build, message):
    with pytest.raises(ConfigError) as err:
        build()
    assert str(err.value) == message


# ---------------------------------------------------------------- per-worker errors name the rule


def _theta():
    return torch.tensor([1.0, -2.0])


@pytest.mark.parametrize(
    "name, call",
    [
        (
            "gap_aware",
            lambda: GapAware(GapAwareConfig(name="gap_aware"), _theta(), 2).step(
                _theta(), _theta(), worker=-1, lag=0
            ),
        ),
        (
            "gap_aware",
            lambda: GapAware(GapAwareConfig(name="gap_aware"), _theta(), 2).params_for(
                _theta(), -1
            ),
        ),
        (
            "dc_asgd",
            lambda: DCASGD(DCASGDConfig(name="dc_asgd"), _theta(), 2).step(
                _theta(), _theta(), worker=-1, lag=0
            ),
        ),
        (
            "dc_asgd",
            lambda: DCASGD(DCASGDConfig(name="dc_asgd"), _theta(), 2).params_for(_theta(), -1),
        ),
        (
            "multi_momentum",
            lambda: MultiMomentum(MultiMomentumConfig(name="multi_momentum"), _theta(), 2).step(
                _theta(), _theta(), worker=-1, lag=0
            ),
        ),
        (
            "dana",
            lambda: Dana(DanaConfig(name="dana"), _theta(), 2).step(
                _theta(), _theta(), worker=-1, lag=0
            ),
        ),
        (  # dc keeps each look-ahead sent, so params_for needs a worker's slot
            "dana",
            lambda: Dana(DanaConfig(name="dana", variant="dc"), _theta(), 2).params_for(
                _theta(), -1
            ),
        ),
        (
            "dana_ga",
            lambda: DanaGapAware(DanaGapAwareConfig(name="dana_ga"), _theta(), 2).step(
                _theta(), _theta(), worker=-1, lag=0
            ),
        ),
        (
            "dana_ga",
            lambda: DanaGapAware(DanaGapAwareConfig(name="dana_ga"), _theta(), 2).params_for(
                _theta(), -1
            ),
        ),
    ],
)
def test_a_rounds_mean_gradient_is_refused_naming_the_rule(name, call):
    """Worker −1 (a round's averaged gradient) has no per-worker slot among N = 2."""
    with pytest.raises(ValueError) as err:
        call()
    assert str(err.value) == (
        f"update rule '{name}' keeps per-worker state and needs a worker in [0, 2), got -1 "
        "(a round's averaged gradient has no worker)"
    )


# ---------------------------------------------------------------- DANA-Slim (§9.3)


def test_dana_slim_decays_phi_itself_by_hand():
    """slim: Φ ← Φ − η(m + wd·Φ), the weight decay taken at Φ (the server's only tensor).
    Dyadic values, so the arithmetic is exact."""
    phi = torch.tensor([1.0, -2.0], dtype=torch.float64)
    rule = Dana(
        DanaConfig(name="dana", variant="slim", lr=0.5, weight_decay=0.5, momentum=0.9), phi, 2
    )
    m = torch.tensor([0.25, 1.5], dtype=torch.float64)  # the worker's message γv + g
    rule.step(phi, m, worker=1, lag=3)
    # m + wd·Φ = (0.25 + 0.5, 1.5 − 1) = (0.75, 0.5); Φ = (1 − 0.375, −2 − 0.25)
    assert torch.equal(phi, torch.tensor([0.625, -2.25], dtype=torch.float64))
    assert rule.params_for(phi, 1) is phi  # Φ is what is sent


# ---------------------------------------------------------------- DSSP controller (§5.2)


def test_multi_counts_exactly_r_max_plus_one_pushes_of_the_slowest():
    """multi aims at q's pushes j = 1..r_max + 1 and no further. r_max = 1, I_p = 3, I_q = 1
    from 0: targets 1, 2. k = 0: T_p = 0, wait |0 − 1| = 1; k = 1: T_p = 3, wait |3 − 2| = 1,
    not smaller, so k = 0 (a third target, 3, would make k = 1 exact)."""
    assert sync_controller(0.0, 3.0, 0.0, 1.0, 1, multi=True) == (0, 1.0)


def test_no_prediction_grants_nothing_beyond_r_max():
    """r* ∈ [0, r_max] even when no k gives a comparable wait (a NaN push time: every wait is
    NaN, never < the initial ∞): r* = 0 with r_max = 0 and the wait left at ∞. Such a time
    never comes from the engine; this pins the documented range of the pure function."""
    assert sync_controller(math.nan, 1.0, 0.0, 1.0, 0) == (0, math.inf)


def test_grant_controller_never_searches_past_r_max():
    """r* ≤ r_max = s_high − s_low whatever gap it is asked at (DSSP asks only past s_low,
    where the room s_high − gap is already below r_max). s_low = 2, s_high = 5: r_max = 3;
    asked at gap 1 the room s_high − gap = 4 would allow 4. p pushed at 0, 1 (I_p = 1, from 1);
    q at 0, 10 (T_q = 20): the nearest T_p(k) = 1 + k with k ≤ 3 is k = 3, wait 20 − 4 = 16."""
    c = GrantController(DSSPConfig(name="dssp", s_low=2, s_high=5), num_workers=2)
    for w, t in [(0, 0.0), (1, 0.0), (0, 1.0), (1, 10.0)]:
        c.record(w, t)
    assert c.decide(0, [3, 2], gap=1) == (3, 16.0)


def _dssp_pushes(controller="next_push"):
    """Two workers, s_low = 1, s_high = 10 (r_max = 9); q = worker 1, p = worker 0. The clocks
    advance by one per push, as the engine's do. Up to p's push at t = 4 every gap is ≤ s_low;
    there p is 2 ahead: I_p = 4 − 3 = 1, q pushed at 0.5 and 3 (I_q = 2.5)."""
    barrier = DSSP(DSSPConfig(name="dssp", s_low=1, s_high=10, controller=controller), 2)
    events = []
    barrier.emit = lambda kind, t, **f: events.append(f)
    for w, clocks, t in [
        (1, [0, 1], 0.5),
        (0, [1, 1], 1.0),
        (0, [2, 1], 2.0),
        (1, [2, 2], 3.0),
        (0, [3, 2], 3.0),
        (0, [4, 2], 4.0),
    ]:
        barrier.observe_push(w, clocks, t)
    return barrier, events


@pytest.mark.parametrize(
    "controller, extra, wait",
    [
        # T_q = 3 + 2.5 = 5.5; T_p(k) = 4 + k: k = 1 gives 5 and k = 2 gives 6, both 0.5 off:
        # the smaller k wins
        ("next_push", 1, 0.5),
        # room = min(9, 10 − 2) = 8, targets 3 + 2.5j for j = 1..9: 5.5, 8, 10.5, ...;
        # T_p(4) = 8 hits the second exactly
        ("multi", 4, 0.0),
    ],
)
def test_dssp_decides_with_the_controller_it_was_configured_with(controller, extra, wait):
    barrier, events = _dssp_pushes(controller)
    assert events == [
        {
            "worker": 0,
            "event": "dssp_grant",
            "extra": extra,
            "predicted_wait_s": wait,
            "clock_gap": 2,
        }
    ]
    assert barrier.remaining[0] == extra  # the paper's OK does not use one up
    assert barrier.admit(0, [4, 2], 2)  # gap 2 > s_low, but granted


def test_dssp_counts_every_grant():
    """After the first grant (r* = 1 at t = 4) p uses it at t = 5 (gap 3); q pushes at 5.5
    (I_q = 5.5 − 3 = 2.5, T_q = 8); p pushes at 6 with gap 3 and no grant left:
    I_p = 1, T_p(k) = 6 + k, so r* = 2 exactly (room min(9, 10 − 3) = 7). Two grants."""
    barrier, events = _dssp_pushes()
    barrier.observe_push(0, [5, 2], 5.0)
    barrier.observe_push(1, [5, 3], 5.5)
    barrier.observe_push(0, [6, 3], 6.0)
    assert [(e["extra"], e["predicted_wait_s"], e["clock_gap"]) for e in events] == [
        (1, 0.5, 2),
        (2, 0.0, 3),
    ]
    assert barrier.grants == 2 and barrier.remaining[0] == 2 and barrier.bound_holds == 0


def test_a_granted_step_past_s_high_is_refused_and_counted():
    """The safety net: s_low = 1, s_high = 4. q pushed at 0 and 10 (T_q = 20), p at 5 and 10
    (I_p = 5); at gap 2 the room is min(3, 4 − 2) = 2 and T_p(2) = 20: r* = 2. The clocks
    then jump (the engine never does this) so that both granted steps lie past s_high: gaps
    7 and 8 > 4. admit refuses each and bound_holds counts 2."""
    barrier = DSSP(DSSPConfig(name="dssp", s_low=1, s_high=4), 2)
    for w, clocks, t in [(1, [0, 1], 0.0), (0, [1, 1], 5.0), (1, [1, 2], 10.0)]:
        barrier.observe_push(w, clocks, t)  # all within s_low
    barrier.observe_push(0, [4, 2], 10.0)
    assert barrier.grants == 1 and barrier.remaining[0] == 2
    assert barrier.admit(0, [4, 2], 2) and barrier.bound_holds == 0
    barrier.observe_push(0, [9, 2], 11.0)
    assert not barrier.admit(0, [9, 2], 2)
    barrier.observe_push(0, [10, 2], 12.0)
    assert not barrier.admit(0, [10, 2], 2)
    assert barrier.bound_holds == 2 and barrier.remaining[0] == 0


# ---------------------------------------------------------------- PSP (§6)


def test_psp_counts_first_checks_and_passes_after_waiting():
    """N = 2, β = 1 from the others: worker 0 always samples worker 1; s = 0. A fresh barrier
    has checked no step, so its first question, about step 1, is a first check (passes: 1 − 1
    = 0). Steps 2 and 3 each wait once (worker 1 one behind) and pass at the re-check."""
    barrier = PSP(PSPConfig(name="psp", sample_size=1, staleness=0), 2)
    assert barrier.admit(0, [1, 1], 1)
    assert not barrier.admit(0, [2, 1], 1)
    assert barrier.admit(0, [2, 2], 2)
    assert not barrier.admit(0, [3, 2], 2)
    assert barrier.admit(0, [3, 3], 3)
    assert (barrier.admitted_first, barrier.admitted_after_wait) == (1, 2)


def test_psp_without_a_seed_draws_as_seed_zero():
    """The default seed is 0, as for every barrier: one sample of 2 from 5 peers per step."""

    def samples(**seed):
        barrier = PSP(PSPConfig(name="psp", sample_size=2), 6, **seed)
        drawn = []
        for step in range(20):
            barrier.admit(0, [step] * 6, step)
            drawn.append(barrier.samples[0])
        return drawn

    assert samples() == samples(seed=0)
    assert samples(seed=0) != samples(seed=1)  # 20 draws do tell the two streams apart


# ---------------------------------------------------------------- per-worker slots and N


@pytest.mark.parametrize("worker", [-1, 3, 4])
def test_a_worker_outside_0_to_n_is_refused_naming_the_class_of_an_unregistered_rule(worker):
    """worker_slot guards per-worker state of N = 3 workers: slots 0, 1, 2 and nothing else
    (3 would index past the rows); a rule that was never registered is named by its class."""

    class Unregistered:
        pass

    assert [worker_slot(Unregistered(), w, 3) for w in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError) as err:
        worker_slot(Unregistered(), worker, 3)
    assert str(err.value) == (
        f"update rule 'Unregistered' keeps per-worker state and needs a worker in [0, 3), "
        f"got {worker} (a round's averaged gradient has no worker)"
    )


# the built-in barriers by name: the registry also holds what other tests register, so
# parametrizing over it would give ids that exist only when those tests are collected too
@pytest.mark.parametrize("name", ["asp", "bsp", "dssp", "psp", "ssp"])
def test_every_barrier_knows_its_number_of_workers(name):
    """The contract's `num_workers` attribute, which a plugin barrier may read, is N as
    built (seed 0 here, so passing the seed in N's place would show)."""
    _, config = BARRIERS.get(name)
    barrier = BARRIERS.build(config(name=name), 5, 0)
    assert barrier.num_workers == 5
