"""The parameter-server state machine, driven by hand-made pushes (no processes)."""

import pytest
import torch

from stalebench.algorithms.barriers import ASP, BSP, SSP, ASPConfig, BSPConfig, SSPConfig
from stalebench.algorithms.base import Barrier, BarrierConfig
from stalebench.algorithms.updates import SGD, SGDConfig
from stalebench.engines.ps import ParameterServer, Push
from stalebench.errors import RunError


def server(barrier, n, lr=1.0):
    events = []
    params = torch.zeros(2)
    ps = ParameterServer(
        params,
        barrier,
        SGD(SGDConfig(name="sgd", lr=lr), params, n),
        n,
        lambda kind, t, **f: events.append({"kind": kind, "t": t, **f}),
    )
    return ps, events


def push(w, clock, version, grad, rtt=0.0):
    return Push(w, clock, version, torch.tensor(grad), loss=1.0, compute_s=0.1, rtt_s=rtt)


def test_bsp_averages_a_round_and_releases_everyone_together():
    ps, events = server(BSP(BSPConfig(name="bsp"), 3), 3)
    assert [r.worker for r in ps.start(0.0)] == [0, 1, 2]
    assert ps.on_push(push(0, 0, 0, [3.0, 0.0]), 1.0) == []
    assert ps.on_push(push(1, 0, 0, [0.0, 3.0]), 2.0) == []
    assert events == []  # nothing applied before the round is complete
    replies = ps.on_push(push(2, 0, 0, [3.0, 3.0]), 3.0)
    assert sorted(r.worker for r in replies) == [0, 1, 2]
    assert all(r.version == 1 for r in replies)
    torch.testing.assert_close(ps.params, torch.tensor([-2.0, -2.0]))  # θ − mean gradient
    assert [(e["worker"], e["version"], e["lag"]) for e in events] == [
        (0, 1, 0),
        (1, 1, 0),
        (2, 1, 0),
    ]
    assert ps.wait_s == [2.0, 1.0, 0.0]  # held from its push to the round's end


def test_asp_lag_counts_updates_between_read_and_apply():
    ps, events = server(ASP(ASPConfig(name="asp"), 3), 3)
    ps.start(0.0)
    for w in range(3):
        (reply,) = ps.on_push(push(w, 0, 0, [1.0, 0.0]), 1.0 + w)
        assert reply.worker == w and reply.version == w + 1
    assert [e["lag"] for e in events] == [0, 1, 2]
    torch.testing.assert_close(ps.params, torch.tensor([-3.0, 0.0]))


def test_ssp_holds_the_fast_worker_until_the_slow_one_catches_up():
    ps, events = server(SSP(SSPConfig(name="ssp", staleness=1), 2), 2)
    ps.start(0.0)
    assert [r.worker for r in ps.on_push(push(0, 0, 0, [1.0, 0.0]), 1.0)] == [0]
    assert ps.on_push(push(0, 1, 1, [1.0, 0.0]), 2.0) == []  # clocks [2, 0]: 2 − 0 > 1
    replies = ps.on_push(push(1, 0, 0, [0.0, 1.0], rtt=0.0), 5.0)
    assert sorted(r.worker for r in replies) == [0, 1]
    assert ps.wait_s[0] == 3.0 and ps.gap[0] == 1  # step 2 of worker 0 admitted at gap 1
    assert events[-1]["lag"] == 2  # worker 1 read version 0, applied at version 2


def test_clock_gap_and_comm_time_reach_the_events():
    ps, events = server(SSP(SSPConfig(name="ssp", staleness=1), 2), 2)
    ps.start(0.0)
    ps.on_push(push(0, 0, 0, [0.0, 0.0]), 1.0)
    ps.on_push(push(0, 1, 1, [0.0, 0.0], rtt=0.5), 2.0)
    ps.on_push(push(1, 0, 0, [0.0, 0.0]), 5.0)  # releases worker 0 after 3 s held
    ps.on_push(push(0, 2, 3, [0.0, 0.0], rtt=3.25), 6.0)
    last = events[-1]
    assert (last["worker"], last["clock"], last["wait_s"], last["comm_s"], last["clock_gap"]) == (
        0,
        2,
        3.0,
        0.25,
        1,
    )


def test_pushing_a_wrong_clock_is_an_error():
    ps, _ = server(ASP(ASPConfig(name="asp"), 2), 2)
    ps.start(0.0)
    with pytest.raises(RunError, match="worker 1 pushed clock 3, expected 0"):
        ps.on_push(push(1, 3, 0, [0.0, 0.0]), 1.0)


class Never(Barrier):
    """A barrier that admits nobody after the first step (a broken plugin)."""

    def admit(self, worker, clocks, slowest):
        return clocks[worker] == 0


def test_a_barrier_that_holds_everyone_is_reported_as_deadlock():
    ps, _ = server(Never(BarrierConfig(name="never"), 2), 2)
    ps.start(0.0)
    ps.on_push(push(0, 0, 0, [0.0, 0.0]), 1.0)
    with pytest.raises(RunError, match="deadlock"):
        ps.on_push(push(1, 0, 0, [0.0, 0.0]), 2.0)


def test_bsp_reformed_over_the_survivors_completes_the_round_without_the_lost_worker():
    # three workers; round 0 has pushes from 0 and 1 when 2 is lost: the round is complete
    # among the survivors, its mean is theirs, and both are released; round 1 needs two
    ps, events = server(BSP(BSPConfig(name="bsp", on_loss="reform"), 3), 3)
    ps.start(0.0)
    assert ps.on_push(push(0, 0, 0, [3.0, 0.0]), 1.0) == []
    assert ps.on_push(push(1, 0, 0, [1.0, 2.0]), 2.0) == []
    replies = ps.lose(2, 2.5)
    assert sorted(r.worker for r in replies) == [0, 1] and ps.version == 1
    torch.testing.assert_close(ps.params, torch.tensor([-2.0, -1.0]))  # − mean of two
    assert [(e["worker"], e["t"]) for e in events] == [(0, 2.5), (1, 2.5)]
    assert ps.min_clock == 1
    assert ps.on_push(push(1, 1, 1, [2.0, 2.0]), 3.0) == []
    assert sorted(r.worker for r in ps.on_push(push(0, 1, 1, [0.0, 0.0]), 4.0)) == [0, 1]
    torch.testing.assert_close(ps.params, torch.tensor([-3.0, -2.0]))


def test_ssp_reformed_over_the_survivors_forgets_the_lost_worker_s_clock():
    # staleness 1: worker 0 runs ahead of the stuck worker 2 until it is held; losing 2
    # makes worker 1 the slowest, and worker 0 may go on
    ps, _ = server(SSP(SSPConfig(name="ssp", staleness=1, on_loss="reform"), 3), 3)
    ps.start(0.0)
    ps.on_push(push(1, 0, 0, [0.0, 0.0]), 1.0)
    assert [r.worker for r in ps.on_push(push(0, 0, 0, [0.0, 0.0]), 1.5)] == [0]
    assert ps.on_push(push(0, 1, 1, [0.0, 0.0]), 2.0) == []  # 2 − 0 > 1: held
    assert ps.min_clock == 0
    assert [r.worker for r in ps.lose(2, 3.0)] == [0]  # the slowest is now worker 1, at 1
    assert ps.min_clock == 1 and ps.lost == {2}


def test_a_barrier_that_waits_fails_on_loss_by_default():
    barrier = SSP(SSPConfig(name="ssp"), 2)
    assert not barrier.survives_loss(barrier.cfg)
    assert SSP.survives_loss(SSPConfig(name="ssp", on_loss="reform"))
    assert ASP.survives_loss(ASPConfig(name="asp"))
