"""A hub's NIC is one link each way for all its peers, in the simulator and in real
processes alike (stalebench.runtime.network)."""

from __future__ import annotations

import pytest

from tests.conftest import run_job

# ASP over 4 workers, a 287k-parameter MLP (1.15 MB a message), 100 Mbit/s each way: one
# push holds the server's downlink 92 ms, so the server takes at most ~10.9 pushes a second;
# with a link of its own per worker (no sharing) each worker would cycle in push + pull +
# step = 0.19 s, ~21 updates a second
SERVER_LINK = [
    "algorithm=asp",
    "model=mlp",
    "model.hidden=[512,512]",
    "dataset=mnist1d",
    "cluster=homogeneous",
    "cluster.num_workers=4",
    "cluster.compute_ms=10",
    "cluster.push_bandwidth_gbps=0.1",
    "cluster.pull_bandwidth_gbps=0.1",
    "budget.max_updates=0",
    "budget.max_wall_s=3",
    "eval.every_s=1.5",
    "eval.every_updates=0",
]


def limit_per_s(run) -> float:
    """The server link's limit: its bandwidth over one push's bytes (the parameters alone:
    the header makes the true limit a little lower)."""
    params = 40 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10
    return 0.1e9 / 8 / (4 * params)


@pytest.mark.timeout(60)
def test_sim_a_server_takes_no_more_pushes_than_its_link_carries(tmp_path):
    run = run_job(tmp_path / "sim", ["runtime=sim", *SERVER_LINK])
    assert run.summary["status"] == "completed", run.summary["error"]
    rate = run.summary["updates"] / run.summary["run_time_s"]
    # at the link's limit: its queue, not the workers, sets the pace
    assert 0.85 * limit_per_s(run) <= rate <= limit_per_s(run)


@pytest.mark.timeout(90)
def test_real_a_server_takes_no_more_pushes_than_its_link_carries(tmp_path):
    run = run_job(tmp_path / "real", SERVER_LINK)
    assert run.summary["status"] == "completed", run.summary["error"]
    rate = run.summary["updates"] / run.summary["run_time_s"]
    assert rate <= 1.05 * limit_per_s(run)  # a margin for where the window ends


# The server and its 4 workers on one host of 5 GPUs, its link at 0.2 Gbit/s: no message
# queues on the server's NIC; each worker cycles through its step, its push over the link
# and the server's reply over it (46 ms each): 4 / 0.102 s, ~39 updates a second, against
# the ~10.9 the server's NIC would let through
ONE_HOST_SERVER = [*SERVER_LINK, "cluster.gpus_per_host=5", "cluster.host_link_gbps=0.2"]


def one_host_cycles_per_s() -> float:
    transfer = 0.1e9 / 8 / limit_per_s(None) / (0.2e9 / 8)  # the parameters over the link
    return 4 / (0.010 + 2 * transfer)


@pytest.mark.timeout(60)
def test_sim_a_server_on_its_workers_host_takes_their_messages_over_the_link(tmp_path):
    run = run_job(tmp_path / "sim", ["runtime=sim", *ONE_HOST_SERVER])
    assert run.summary["status"] == "completed", run.summary["error"]
    rate = run.summary["updates"] / run.summary["run_time_s"]
    assert rate == pytest.approx(one_host_cycles_per_s(), rel=0.03)  # the window's edges


@pytest.mark.timeout(90)
def test_real_a_server_on_its_workers_host_takes_their_messages_over_the_link(tmp_path):
    run = run_job(tmp_path / "real", ONE_HOST_SERVER)
    assert run.summary["status"] == "completed", run.summary["error"]
    rate = run.summary["updates"] / run.summary["run_time_s"]
    # real processes are slower than the model, never faster; through the NIC: ~10.9/s
    assert 0.7 * one_host_cycles_per_s() <= rate <= 1.05 * one_host_cycles_per_s()


# Two gossip nodes (SGP), each sending the other its 1.15 MB [x | w] every iteration over
# 100 Mbit/s: the message's transfer is its sender's push (92 ms), which the receiver does
# not pay again (its bytes reach it as they leave), so an iteration is the 10 ms step plus
# one transfer, ~9.8 a second; paying a push and then a pull would make it ~5.1
PEERS = [
    *(o for o in SERVER_LINK if not o.startswith(("algorithm=", "cluster.num_workers="))),
    "algorithm=sgp",
    "cluster.num_workers=2",
]


# The same two nodes on one host of two GPUs (cluster.gpus_per_host=2), its link at
# 0.2 Gbit/s: the message goes over the link (46 ms), not through the host's NIC (92 ms),
# ~17.9 iterations a second against ~9.8
ONE_HOST = [*PEERS, "cluster.gpus_per_host=2", "cluster.host_link_gbps=0.2"]
# each case: its settings, the Gbit/s its message crosses at, the least share of the
# model's rate real processes reach (an iteration's own overhead weighs more the faster)
TRANSFERS = {"two-hosts": (PEERS, 0.1, 0.75), "one-host": (ONE_HOST, 0.2, 0.7)}


def one_transfer_per_s(gbps: float) -> float:
    """Iterations a second: the 10 ms step plus one transfer of [x | w] (d + 1 floats) at
    `gbps`."""
    message = 0.1e9 / 8 / limit_per_s(None) + 4  # the parameters' bytes, then w's
    return 1 / (0.010 + message / (gbps * 1e9 / 8))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", TRANSFERS)
def test_sim_a_message_between_peers_costs_one_transfer(tmp_path, case):
    settings, gbps, _ = TRANSFERS[case]
    run = run_job(tmp_path / "sim", ["runtime=sim", *settings])
    assert run.summary["status"] == "completed", run.summary["error"]
    rate = run.summary["throughput_updates_per_s"]
    assert rate == pytest.approx(one_transfer_per_s(gbps), rel=0.02)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("case", TRANSFERS)
def test_real_a_message_between_peers_costs_one_transfer(tmp_path, case):
    settings, gbps, least = TRANSFERS[case]
    run = run_job(tmp_path / "real", settings)
    assert run.summary["status"] == "completed", run.summary["error"]
    rate = run.summary["throughput_updates_per_s"]
    # real processes are slower than the model, never faster; a pull paid again, or the
    # one-host message through the NIC: ~5.1/s, ~9.8/s
    assert least * one_transfer_per_s(gbps) <= rate <= 1.05 * one_transfer_per_s(gbps)
