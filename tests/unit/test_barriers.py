"""Barrier admission rules against their definitions (docs/algorithms.md §2–§4, §12)."""

import itertools
from collections.abc import Sequence

import pytest
import torch

from stalebench.algorithms.barriers import ASP, BSP, SSP, ASPConfig, BSPConfig, SSPConfig
from stalebench.algorithms.base import BARRIERS, Barrier, BarrierConfig
from stalebench.algorithms.dssp import DSSP, DSSPConfig
from stalebench.algorithms.updates import SGD, SGDConfig
from stalebench.engines.ps import ParameterServer, Push
from stalebench.errors import ConfigError
from stalebench.plugins import load as load_plugins


def ssp(s: int, **kw) -> SSP:
    return SSP(SSPConfig(name="ssp", staleness=s, **kw), num_workers=3)


@pytest.mark.parametrize("s", [0, 1, 2, 5])
def test_ssp_truth_table(s):
    """Start step c only while c − min_j clock_j ≤ s, for every clock vector up to 7."""
    barrier = ssp(s)
    for clocks in itertools.product(range(8), repeat=3):
        for w in range(3):
            expected = clocks[w] - min(clocks) <= s
            assert barrier.admit(w, list(clocks), min(list(clocks))) == expected, (clocks, w)


def test_ssp_zero_is_bsp_barrier_and_bsp_averages_rounds():
    bsp = BSP(BSPConfig(name="bsp"), num_workers=3)
    assert bsp.per_round and not ssp(0).per_round
    for clocks in itertools.product(range(4), repeat=3):
        for w in range(3):
            assert bsp.admit(w, list(clocks), min(list(clocks))) == ssp(0).admit(
                w, list(clocks), min(list(clocks))
            )


def test_ssp_infinite_staleness_is_asp():
    asp = ASP(ASPConfig(name="asp"), num_workers=3)
    big = ssp(10**9)
    for clocks in itertools.product(range(6), repeat=3):
        for w in range(3):
            assert asp.admit(w, list(clocks), min(list(clocks))) and big.admit(
                w, list(clocks), min(list(clocks))
            )


def test_bad_barrier_config_names_the_key():
    with pytest.raises(ConfigError, match=r"algorithm\.barrier\.staleness.*-1"):
        SSPConfig(name="ssp", staleness=-1)
    with pytest.raises(ConfigError, match=r"algorithm\.barrier\.apply.*per_arrival"):
        BSPConfig(name="bsp", apply="per_arrival")
    with pytest.raises(ConfigError, match=r"algorithm\.barrier\.apply.*'sometimes'"):
        SSPConfig(name="ssp", apply="sometimes")


class Unscannable(Sequence):
    """Clocks a barrier may index but not scan: min(), max(), sum() or a loop over them
    raises, so a barrier that recomputes the slowest clock itself fails."""

    def __init__(self, clocks):
        self._clocks = list(clocks)

    def __getitem__(self, i):
        if isinstance(i, slice):
            raise AssertionError("the barrier sliced the clocks")
        return self._clocks[i]

    def __len__(self):
        return len(self._clocks)

    def __iter__(self):
        raise AssertionError("the barrier scanned the clocks instead of using `slowest`")


def built_in_barriers(n):
    load_plugins()
    for name in BARRIERS.names():
        cls, config = BARRIERS.get(name)
        if cls.__module__.startswith("stalebench."):
            yield name, cls(config(name=name), n)


def test_no_built_in_barrier_scans_the_clocks_on_admission():
    names = []
    for name, barrier in built_in_barriers(3):
        names.append(name)
        if type(barrier).admit is Barrier.admit:  # a gathering barrier: asked admit_gathered
            assert barrier.gathers, name
            continue
        for clocks in ([0, 0, 0], [2, 1, 0], [5, 3, 4]):
            for w in range(3):
                barrier.admit(w, Unscannable(clocks), min(clocks))
    assert {"asp", "bsp", "ssp", "dssp", "psp"} <= set(names)


def test_ssp_and_dssp_admit_against_the_slowest_clock_they_are_given():
    # slowest = 4 is not min(clocks) = 3: the answer shows which one the barrier used
    clocks = [5, 3, 3]
    assert ssp(1).admit(0, clocks, 4) and not ssp(1).admit(0, clocks, 3)
    dssp = DSSP(DSSPConfig(name="dssp", s_low=1, s_high=4), 3)
    assert dssp.admit(0, clocks, 4) and not dssp.admit(0, clocks, 3)


class Recording(Barrier):
    def __init__(self, n):
        super().__init__(BarrierConfig(name="recording"), n)
        self.calls = []

    def admit(self, worker, clocks, slowest):
        self.calls.append((list(clocks), slowest))
        return True


def test_the_server_passes_its_slowest_clock():
    n = 3
    barrier = Recording(n)
    ps = ParameterServer(
        torch.zeros(2),
        barrier,
        SGD(SGDConfig(name="sgd"), torch.zeros(2), n),
        n,
        lambda *a, **k: None,
    )
    ps.start(0.0)
    for t, w in enumerate([0, 0, 1, 2, 0, 1, 1, 2, 2, 2]):
        clock = ps.clocks[w]
        ps.on_push(Push(w, clock, ps.version, torch.ones(2), 0.0, 0.0, 0.0), float(t + 1))
    assert len(barrier.calls) == n + 10
    assert all(slowest == min(clocks) for clocks, slowest in barrier.calls)
    assert {slowest for _, slowest in barrier.calls} == {0, 1, 2, 3}
