"""Barrier admission rules against their definitions (docs/algorithms.md §2–§4, §12)."""

import itertools

import pytest

from stalebench.algorithms.barriers import ASP, BSP, SSP, ASPConfig, BSPConfig, SSPConfig
from stalebench.errors import ConfigError


def ssp(s: int, **kw) -> SSP:
    return SSP(SSPConfig(name="ssp", staleness=s, **kw), num_workers=3)


@pytest.mark.parametrize("s", [0, 1, 2, 5])
def test_ssp_truth_table(s):
    """Start step c only while c − min_j clock_j ≤ s, for every clock vector up to 7."""
    barrier = ssp(s)
    for clocks in itertools.product(range(8), repeat=3):
        for w in range(3):
            expected = clocks[w] - min(clocks) <= s
            assert barrier.admit(w, list(clocks)) == expected, (clocks, w)


def test_ssp_zero_is_bsp_barrier_and_bsp_averages_rounds():
    bsp = BSP(BSPConfig(name="bsp"), num_workers=3)
    assert bsp.per_round and not ssp(0).per_round
    for clocks in itertools.product(range(4), repeat=3):
        for w in range(3):
            assert bsp.admit(w, list(clocks)) == ssp(0).admit(w, list(clocks))


def test_ssp_infinite_staleness_is_asp():
    asp = ASP(ASPConfig(name="asp"), num_workers=3)
    big = ssp(10**9)
    for clocks in itertools.product(range(6), repeat=3):
        for w in range(3):
            assert asp.admit(w, list(clocks)) and big.admit(w, list(clocks))


def test_bad_barrier_config_names_the_key():
    with pytest.raises(ConfigError, match=r"algorithm\.barrier\.staleness.*-1"):
        SSPConfig(name="ssp", staleness=-1)
    with pytest.raises(ConfigError, match=r"algorithm\.barrier\.apply.*per_arrival"):
        BSPConfig(name="bsp", apply="per_arrival")
    with pytest.raises(ConfigError, match=r"algorithm\.barrier\.apply.*'sometimes'"):
        SSPConfig(name="ssp", apply="sometimes")
