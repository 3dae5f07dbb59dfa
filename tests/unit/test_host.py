"""The simulator's host model (stalebench.runtime.compute.Host, cluster.host_cores,
overhead_ms, stall_ms, hub_ms, wake_ms): what processes on one machine pay beyond the
profile's steps and messages."""

from __future__ import annotations

import pytest

from stalebench.runtime.compute import Host
from tests.conftest import run_job


def test_no_cores_given_shares_nothing():
    host = Host(0, 4)
    assert [host.run(r, 0.0, 0.01) for r in range(4)] == [0.01] * 4


def test_ranks_busy_beyond_the_cores_share_them():
    host = Host(2, 4)
    # two at once on two cores: each its own; a third and a fourth while they run: 3/2, 4/2
    assert host.run(0, 0.0, 1.0) == 1.0
    assert host.run(1, 0.0, 1.0) == 1.0
    assert host.run(2, 0.5, 1.0) == pytest.approx(1.5)
    assert host.run(3, 0.5, 1.0) == pytest.approx(2.0)
    # later, rank 0 again: ranks 2 and 3 still busy (until 2.0 and 2.5), rank 1 done at 1.0
    assert host.run(0, 1.5, 1.0) == pytest.approx(1.5)
    # a rank idle between its works counts for nothing then
    assert host.run(1, 3.0, 1.0) == 1.0


def test_a_rank_waits_for_a_core_only_while_the_ranks_outnumber_the_cores():
    for form in ("sqrt", "queued"):
        assert Host(2, 3, 0.005, form).wake(0, 0.0) == 0.005  # one beyond: wake_s
        assert Host(2, 2, 0.005, form).wake(0, 0.0) == 0.0  # a core each
        assert Host(0, 3, 0.005, form).wake(0, 0.0) == 0.0  # no cores given: nothing shared
    assert Host(2, 5, 0.005, "queued").wake(0, 0.0) == pytest.approx(0.015)  # three: 3 ×


def test_by_default_the_wait_grows_as_the_root_of_the_ranks_beyond_the_cores():
    assert Host(2, 6, 0.005).wake(0, 0.0) == pytest.approx(0.010)  # four: 2 ×
    assert Host(2, 11, 0.005).wake(0, 0.0) == pytest.approx(0.015)  # nine: 3 ×
    from stalebench.cluster import ClusterConfig

    assert ClusterConfig().wake_form == "sqrt"


def test_in_the_busy_form_a_rank_waits_only_for_the_ranks_busy_when_it_wakes():
    host = Host(2, 4, 0.005, "busy")
    host.run(0, 0.0, 1.0)
    host.run(1, 0.0, 1.0)
    # ranks 0 and 1 compute until 1.0: rank 2, woken at 0.5, is the third busy on two cores
    assert host.wake(2, 0.5) == pytest.approx(0.005)
    assert host.wake(0, 0.5) == 0.0  # rank 0 itself and rank 1: a core each
    assert host.wake(2, 1.5) == 0.0  # nobody computing: a core idle takes it at once
    host.run(3, 0.5, 1.0)  # three computing (rank 3 stretched to 1.5 s, until 2.0)
    assert host.wake(2, 0.75) == pytest.approx(0.010)  # it makes four: two beyond the cores
    assert Host(2, 2, 0.005, "busy").wake(0, 0.0) == 0.0  # a core each, ever


SERVER = [
    "runtime=sim",
    "algorithm=asp",
    "cluster=homogeneous",
    "cluster.num_workers=4",
    "cluster.compute_ms=10",
    "budget.max_updates=0",
    "budget.max_wall_s=2",
]


def rate(run) -> float:
    assert run.summary["status"] == "completed", run.summary["error"]
    return run.summary["updates"] / run.summary["run_time_s"]


@pytest.mark.timeout(60)
def test_a_hubs_handling_bounds_its_updates(tmp_path):
    # four workers stepping every 10 ms offer 400 updates a second; a server that handles
    # a message in 5 ms takes at most 200 of them
    free = rate(run_job(tmp_path / "free", SERVER))
    busy = rate(run_job(tmp_path / "busy", [*SERVER, "cluster.hub_ms=5"]))
    assert free == pytest.approx(400, rel=0.02)
    assert busy == pytest.approx(200, rel=0.02)


@pytest.mark.timeout(60)
def test_ranks_sharing_cores_and_a_steps_overhead_slow_the_steps(tmp_path):
    base = [*SERVER, "algorithm=bsp", "engine=allreduce"]
    alone = rate(run_job(tmp_path / "alone", base))
    shared = rate(run_job(tmp_path / "shared", [*base, "cluster.host_cores=2"]))
    loop = rate(run_job(tmp_path / "loop", [*base, "cluster.overhead_ms=5"]))
    # four replicas stepping at once on two cores: a round twice as long (the last of them
    # to start shares the cores with all four); a loop of 5 ms around each 10 ms step: 1.5
    # times as long
    assert shared == pytest.approx(alone / 2, rel=0.05)
    assert loop == pytest.approx(alone / 1.5, rel=0.05)


@pytest.mark.timeout(60)
def test_a_stall_is_waited_on_no_core(tmp_path):
    # four replicas, 10 ms steps, on two cores: a step of CPU stretched to 20 ms; 5 ms more
    # of CPU (overhead_ms) stretched too, to 30 ms; 5 ms waited on no core (stall_ms) not,
    # to 25 ms
    base = [*SERVER, "algorithm=bsp", "engine=allreduce", "cluster.host_cores=2"]
    shared = rate(run_job(tmp_path / "shared", base))
    cpu = rate(run_job(tmp_path / "cpu", [*base, "cluster.overhead_ms=5"]))
    stall = rate(run_job(tmp_path / "stall", [*base, "cluster.stall_ms=5"]))
    assert cpu == pytest.approx(shared * 20 / 30, rel=0.05)
    assert stall == pytest.approx(shared * 20 / 25, rel=0.05)


@pytest.mark.timeout(90)
def test_a_real_runs_steps_measure_their_cpu_apart_from_their_wall_time(tmp_path):
    # a step padded to a 20 ms profile sleeps most of it: its wall time is the profile's,
    # its process's CPU a fraction of it (the step itself, a few ms at most)
    job = ["engine=allreduce", "algorithm=bsp", "cluster=homogeneous", "cluster.num_workers=2",
           "cluster.compute_ms=20", "budget.max_updates=15"]  # fmt: skip
    cycle = run_job(tmp_path / "padded", job).summary["cycle"]
    assert cycle["steps"] >= 2 * 14  # each replica's steps after its first
    assert cycle["wall_ms"] >= 20
    assert 0 < cycle["cpu_ms"] < cycle["wall_ms"] / 2


@pytest.mark.timeout(90)
def test_a_real_server_times_its_handling_of_a_message(tmp_path):
    real = ["algorithm=asp", "cluster.num_workers=1", "budget.max_updates=30"]
    run = run_job(tmp_path / "ps", real)
    hub = run.summary["hub"]
    assert hub["messages"] >= 30 and 0 < hub["handling_ms"] < 1000
    assert 0 < hub["cpu_ms"] < 1000  # its process's CPU a message, every thread
    allreduce = run_job(tmp_path / "ar", ["algorithm=bsp", "engine=allreduce",
                                          "budget.max_updates=10"])  # fmt: skip
    assert "hub" not in allreduce.summary  # no hub


@pytest.mark.timeout(60)
def test_a_rank_that_blocked_on_a_message_waits_for_a_core(tmp_path):
    # one worker stepping 10 ms and its server, two ranks: on one core each that blocked
    # waits 5 ms for it once its message is in (the server for the gradient, the worker for
    # the reply): a cycle of 10 + 5 + 5 ms, 50 updates a second; on two cores none waits
    one = [*SERVER, "cluster.num_workers=1", "cluster.wake_ms=5"]
    assert rate(run_job(tmp_path / "free", one[:-1])) == pytest.approx(100, rel=0.02)
    assert rate(run_job(tmp_path / "woken", [*one, "cluster.host_cores=1"])) == pytest.approx(
        50, rel=0.02
    )
    assert rate(run_job(tmp_path / "cores", [*one, "cluster.host_cores=2"])) == pytest.approx(
        100, rel=0.02
    )
    # in the busy form the two never compete on the one core (each blocks while the other
    # computes): none waits
    busy = [*one, "cluster.host_cores=1", "cluster.wake_form=busy"]
    assert rate(run_job(tmp_path / "busy", busy)) == pytest.approx(100, rel=0.02)


def test_an_unknown_wake_form_is_refused_naming_the_key():
    from stalebench.cluster import ClusterConfig
    from stalebench.errors import ConfigError

    with pytest.raises(
        ConfigError, match=r"cluster\.wake_form must be one of sqrt, queued, busy, got 'x'"
    ):
        ClusterConfig(wake_form="x")
