"""PSP against its definition (docs/algorithms.md §6, §12, A-PSP-1/2)."""

import itertools
import random

import pytest

from stalebench.algorithms.barriers import ASP, SSP, ASPConfig, SSPConfig
from stalebench.algorithms.psp import PSP, PSPConfig
from stalebench.errors import ConfigError


def psp(n=3, seed=0, **kw) -> PSP:
    return PSP(PSPConfig(name="psp", **kw), num_workers=n, seed=seed)


def random_run(barrier, n, checks, seed):
    """A random but barrier-respecting progression: a random worker asks to start its next
    step; if admitted it completes that step. Returns the sequence of decisions."""
    rng = random.Random(seed)
    clocks, decisions = [0] * n, []
    for _ in range(checks):
        w = rng.randrange(n)
        ok = barrier.admit(w, clocks, min(clocks))
        decisions.append(ok)
        if ok:
            clocks[w] += 1
    return decisions


def test_config_errors_name_the_key_and_the_value():
    with pytest.raises(ConfigError, match=r"algorithm\.barrier\.sample_size must be >= 0, got -1"):
        PSPConfig(name="psp", sample_size=-1)
    with pytest.raises(ConfigError, match=r"algorithm\.barrier\.staleness must be >= 0, got -2"):
        PSPConfig(name="psp", staleness=-2)
    with pytest.raises(ConfigError, match=r"algorithm\.barrier\.sample_from.*'all'.*'peers'"):
        PSPConfig(name="psp", sample_from="peers")
    with pytest.raises(ConfigError, match=r"algorithm\.barrier\.apply.*'sometimes'"):
        PSPConfig(name="psp", apply="sometimes")


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("s", [0, 1, 3])
@pytest.mark.parametrize("resample", [False, True])
def test_sampling_every_other_worker_is_ssp(n, s, resample):
    """§12: β = N − 1 from the others is SSP(s), whatever the draw order."""
    barrier = psp(n, sample_size=n - 1, staleness=s, resample_while_waiting=resample)
    ssp = SSP(SSPConfig(name="ssp", staleness=s), n)
    rng = random.Random(n * 10 + s)
    for _ in range(2000):
        clocks = [rng.randrange(8) for _ in range(n)]
        w = rng.randrange(n)
        assert barrier.admit(w, clocks, min(clocks)) == ssp.admit(w, clocks, min(clocks)), (
            clocks,
            w,
        )
    # and the same over an exhaustive grid of small clock vectors
    for clocks in itertools.product(range(5), repeat=min(n, 3)):
        clocks = list(clocks) + [0] * (n - len(clocks))
        for w in range(n):
            assert barrier.admit(w, clocks, min(clocks)) == ssp.admit(w, clocks, min(clocks)), (
                clocks,
                w,
            )


@pytest.mark.parametrize("sample_from", ["others", "all"])
def test_sample_size_zero_is_asp(sample_from):
    barrier = psp(4, sample_size=0, staleness=0, sample_from=sample_from)
    asp = ASP(ASPConfig(name="asp"), 4)
    for clocks in itertools.product(range(6), repeat=4):
        for w in range(4):
            assert barrier.admit(w, list(clocks), min(list(clocks))) and asp.admit(
                w, list(clocks), min(list(clocks))
            )
    assert barrier.samples == [[], [], [], []]


def test_same_seed_same_decisions_different_seeds_differ():
    def run(seed):
        barrier = psp(8, seed=seed, sample_size=2, staleness=1)
        return random_run(barrier, 8, 3000, seed=123), barrier

    first, b1 = run(7)
    again, b2 = run(7)
    assert first == again and b1.samples == b2.samples
    assert not all(first)  # the barrier does hold workers
    assert any(run(seed)[0] != first for seed in range(8, 12))


def test_sticky_sample_keeps_waiting_resampling_lets_through():
    """A-PSP-2. Worker 0 starts step 1; worker 1 has not finished step 0, worker 2 has.
    With β = 1 a sample of {1} blocks it: sticky, it stays blocked while worker 1 is behind;
    resampled, it passes as soon as a draw picks worker 2."""
    clocks = [1, 0, 1]
    seeds = [
        seed
        for seed in range(50)
        if psp(seed=seed, sample_size=1).admit(0, clocks, min(clocks)) is False
    ]
    assert seeds  # about half of the seeds draw worker 1 first
    for seed in seeds[:5]:
        sticky = psp(seed=seed, sample_size=1)
        fresh = psp(seed=seed, sample_size=1, resample_while_waiting=True)
        assert not sticky.admit(0, clocks, min(clocks)) and not fresh.admit(
            0, clocks, min(clocks)
        )  # same first draw
        assert sticky.samples[0] == fresh.samples[0] == [1]
        assert not any(sticky.admit(0, clocks, min(clocks)) for _ in range(40))
        assert sticky.samples[0] == [1]
        assert any(fresh.admit(0, clocks, min(clocks)) for _ in range(40))
        assert fresh.samples[0] == [2] and fresh.admitted_after_wait == 1
        # the sticky sample passes once its peer catches up, and counts as a pass after waiting
        assert sticky.admit(0, [1, 1, 1], min([1, 1, 1]))
        assert (sticky.admitted_first, sticky.admitted_after_wait) == (0, 1)


def test_a_new_step_draws_a_new_sample():
    barrier = psp(6, seed=3, sample_size=2)
    drawn = set()
    for step in range(30):
        clocks = [step] * 6
        assert barrier.admit(0, clocks, min(clocks))
        assert 0 not in barrier.samples[0] and len(barrier.samples[0]) == 2
        drawn.add(tuple(sorted(barrier.samples[0])))
    assert len(drawn) > 1
    assert (barrier.admitted_first, barrier.admitted_after_wait) == (30, 0)


def test_sampling_from_all_can_pick_the_worker_itself():
    """A-PSP-1: from all N a worker may sample itself (which never lags), from others never."""
    picked_self = {"others": 0, "all": 0}
    passed = {"others": 0, "all": 0}
    for sample_from in picked_self:
        for seed in range(200):
            barrier = psp(2, seed=seed, sample_size=1, sample_from=sample_from)
            passed[sample_from] += barrier.admit(
                0, [1, 0], min([1, 0])
            )  # worker 1 lags by 1 > s = 0
            picked_self[sample_from] += barrier.samples[0] == [0]
    assert picked_self["others"] == 0 and passed["others"] == 0
    assert 0 < picked_self["all"] < 200 and passed["all"] == picked_self["all"]


@pytest.mark.parametrize(("sample_from", "size"), [("others", 2), ("all", 3)])
def test_sample_size_is_clamped_to_the_population(sample_from, size):
    barrier = psp(3, sample_size=10, staleness=1, sample_from=sample_from)
    assert barrier.sample_size == size
    assert barrier.admit(1, [2, 2, 1], min([2, 2, 1]))
    assert sorted(barrier.samples[1]) == ([0, 2] if sample_from == "others" else [0, 1, 2])
    assert not barrier.admit(0, [3, 2, 1], min([3, 2, 1]))  # SSP(1): 3 − 1 > 1
    assert psp(1, sample_size=5).admit(0, [7], min([7]))  # a lone worker has nobody to wait for
