"""A topology's shared links in both runtimes (stalebench.runtime.network.Topology): the
workers in other racks than the server's reach it through its rack's one downlink and
hear from it through its one uplink, whatever their own NICs."""

from __future__ import annotations

import pytest

from tests.conftest import run_job
from tests.integration.test_network_links import SERVER_LINK, limit_per_s

# The server-link job of test_network_links (ASP over 4 workers, a 287k-parameter MLP,
# 1.15 MB a message) with its NICs unlimited and racks of 2 hosts behind 100 Mbit/s
# uplinks: rack 0 holds the server and worker 0, rack 1
# workers 1 and 2, rack 2 worker 3. One message holds a rack link 92 ms, so the three
# workers outside the server's rack, whose pushes all come down rack 0's downlink and
# whose replies all go up its uplink, make at most ~10.9 updates a second together;
# worker 0, in the server's rack, crosses no shared link: a 10 ms step each
RACKS = [
    *(o for o in SERVER_LINK if not o.startswith(("cluster.push_", "cluster.pull_"))),
    "cluster.rack_size=2",
    "cluster.rack_bandwidth_gbps=0.1",
    "cluster.rack_latency_ms=1",
]
LIMIT = limit_per_s(None)  # messages a second through one 100 Mbit/s link


def rates(run) -> tuple[float, float]:
    """Updates a second of worker 0 (the server's rack) and of the others together."""
    seconds = run.summary["run_time_s"]
    updates = [e for e in run.events if e["kind"] == "update"]
    near = sum(e["worker"] == 0 for e in updates)
    return near / seconds, (len(updates) - near) / seconds


def check(run, low: float) -> None:
    assert run.summary["status"] == "completed", run.summary["error"]
    near, far = rates(run)
    assert low * LIMIT <= far <= 1.05 * LIMIT  # the rack link's limit sets their pace
    assert near > 3 * far  # in the server's rack: no shared link on its way


@pytest.mark.timeout(60)
def test_sim_workers_beyond_the_servers_rack_share_its_rack_link(tmp_path):
    check(run_job(tmp_path / "sim", ["runtime=sim", *RACKS]), 0.85)


@pytest.mark.timeout(90)
def test_real_workers_beyond_the_servers_rack_share_its_rack_link(tmp_path):
    check(run_job(tmp_path / "real", RACKS), 0.7)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "algorithm",
    [
        ["algorithm=asp"],
        ["algorithm=bsp", "engine=allreduce"],
        ["algorithm=bsp", "engine=allreduce", "engine.bucket_mb=0.001"],
        ["algorithm=diloco", "algorithm.outer.inner_steps=4"],
        ["algorithm=sgp"],
    ],
    ids=["ps", "allreduce", "ddp", "local", "gossip"],
)
def test_racks_whose_links_cost_nothing_are_the_one_switch_network(tmp_path, algorithm):
    # every host a rack of its own, every message and collective through the racks' links
    # and the hierarchy's levels, at no latency and unlimited bandwidth: the same events,
    # byte for byte, as one switch on the same costed NICs (a rack latency of 1 µs: not)
    base = ["runtime=sim", *algorithm, "cluster=slow_network", "budget.max_updates=40"]
    flat = run_job(tmp_path / "flat", base)
    assert flat.summary["status"] == "completed", flat.summary["error"]
    for name, extra in (("racks", []), ("costed", ["cluster.rack_latency_ms=0.001"])):
        run_job(tmp_path / name, [*base, "cluster.rack_size=1", *extra])
    events = {d: (tmp_path / d / "events.jsonl").read_bytes() for d in ("flat", "racks", "costed")}
    assert events["racks"] == events["flat"]
    assert events["costed"] != events["flat"]
