"""The simulator as a runtime (stalebench.runtime.sim): programs written against the world a
rank sees run on virtual clocks, one per rank, with the profile's network paid exactly as
the module says; a lost rank, a program that waits forever, and a failing rank 0 each end
the run with summary.json written."""

from __future__ import annotations

import json

import pytest
import torch

from stalebench.errors import RunError
from stalebench.job import Job
from stalebench.metrics.events import read_events
from stalebench.runtime.faults import Faults
from stalebench.runtime.sim import Simulator
from tests.conftest import compose, fast_with

NETWORK = [
    "cluster.push_latency_ms=7",
    "cluster.pull_latency_ms=3",
    "cluster.push_bandwidth_gbps=0.001",
    "cluster.pull_bandwidth_gbps=0.002",
]


def simulator(tmp_path, *overrides: str, size: int = 3) -> Simulator:
    base = ["runtime=sim", "cluster.num_workers=3", "budget.max_updates=10", *NETWORK]
    cfg = compose(fast_with([*base, *overrides]))
    cfg.run_dir = str(tmp_path)
    return Simulator(Job.build(cfg), tmp_path, size)


def finish(world, **fields):
    """Rank 0 ends the run as an engine does: θ₀ unchanged, its summary returned."""
    if world.record is None:
        return None
    params = torch.zeros(sum(p.numel() for p in world.record.job.model().parameters()))
    world.record.events.emit("system", world.now(), event="probe", **fields)
    return world.record.finish(world.record.job.model(), params, 0, world.now(), "completed", None)


@pytest.mark.parametrize("downlink", ["0.002", "0.0005"], ids=["fast", "slow-binds"])
def test_a_peers_message_is_one_transfer_and_queues_on_the_receivers_downlink(tmp_path, downlink):
    """Between two peers (no hub), a message costs its sender the push time, during which
    its bytes reach the receiver: the receiver does not pay it again. A second message is
    through once the receiver's downlink has taken the first (bytes ÷ pull bandwidth): a
    downlink slower than the sender's uplink holds it back."""
    sim, seen = simulator(tmp_path, f"cluster.pull_bandwidth_gbps={downlink}"), {}
    buf = torch.arange(250, dtype=torch.float32)  # 1,000 bytes: bandwidth matters

    def program(job, world):
        if world.rank == 1:
            _, took = yield from world.compute(lambda: None, 0.3)
            yield from world.isend(buf, 2)
            yield from world.isend(buf * 2, 2)  # one send after the other
            seen["sender"] = (took, world.now())
        if world.rank == 2:
            first, second = torch.empty(250), torch.empty(250)
            seen["waited"] = [(yield from world.recv(first, 1))]
            seen["waited"].append((yield from world.recv(second, 1)))
            seen["got"] = (first.tolist(), second.tolist(), world.now())
        return finish(world)

    summary = sim.run(program)
    network = sim.worlds[0].network
    push, up, down = network.push_s(1000), network.push_wire_s(1000), network.pull_wire_s(1000)
    assert push > 0.007 and network.pull_s(1000) > 0.003  # latency and bandwidth both paid
    assert seen["sender"] == (0.3, 0.3 + push + push)
    late = max(down - up, 0.0)  # a downlink slower than the uplink lets the bytes in later
    assert (late > 0) == (downlink == "0.0005")
    first_in = 0.3 + push + late
    through = max(0.3 + push + push + late, first_in + down)  # behind the first
    assert seen["waited"] == [first_in, through - first_in]
    first, second, t = seen["got"]
    assert first == buf.tolist() and second == (buf * 2).tolist()
    assert t == through  # no pull paid after it: the push was the transfer
    assert summary["status"] == "completed"


def test_an_all_reduce_sums_in_rank_order_and_ends_at_the_latest_clock_plus_each_cost(tmp_path):
    sim, seen = (
        simulator(tmp_path, "cluster.faults=[{worker:2,at_step:0,action:slow,delay_ms:50}]"),
        {},
    )

    def program(job, world):
        world.faults = Faults(job.profile, world.rank)
        world.strike()  # worker 2's slow fault starts with its first step
        yield from world.compute(lambda: None, [0.1, 0.4, 0.2][world.rank])
        buf = torch.full((100,), float(world.rank + 1))
        yield from world.all_reduce(buf)
        seen[world.rank] = (buf[0].item(), world.now())
        return finish(world)

    sim.run(program)
    cost = sim.worlds[0].network.allreduce_s(400)
    done = max(0.1 + cost, 0.4 + cost, 0.2 + cost + 0.05)
    assert seen == {r: (6.0, done) for r in range(3)}


def test_a_lost_rank_reaches_every_rank_waiting_for_it_as_a_timeout(tmp_path):
    sim, errors = simulator(tmp_path, "cluster.faults=[{worker:1,at_s:0.5,action:die}]"), {}

    def program(job, world):
        world.faults = Faults(job.profile, world.rank)
        try:
            for _ in range(10):
                world.strike()
                yield from world.compute(lambda: None, 0.2)
                yield from world.all_reduce(torch.zeros(4))
        except RunError as exc:
            errors[world.rank] = (type(exc).__name__, str(exc), world.now())
            if world.record is None:
                raise
            world.record.events.emit("system", world.now(), event="error", error=str(exc))
            return world.record.fail(world.now(), 0, str(exc))

    summary = sim.run(program)
    assert summary["status"] == "failed" and "worker 1 died" in summary["error"]
    # rank 1 itself raised WorkerDied; the others learn of it where they wait, at their time
    assert errors[1][0] == "WorkerDied"
    assert {r: e[0] for r, e in errors.items() if r != 1} == {0: "RunError", 2: "RunError"}
    assert errors[0][2] >= 0.5 and errors[0][2] == errors[2][2]
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "failed"


def test_a_program_that_waits_forever_fails_the_run_by_name(tmp_path):
    sim = simulator(tmp_path)

    def program(job, world):
        if world.rank == 0:
            try:
                yield from world.recv(torch.empty(1), 2)  # rank 2 never sends
            except RunError as exc:
                return world.record.fail(world.now(), 0, str(exc))
        return None

    summary = sim.run(program)
    assert summary["status"] == "failed"
    assert "rank 0 waits forever (recv)" in summary["error"]


def test_rank_0_failing_still_ends_the_run_with_its_summary(tmp_path):
    sim = simulator(tmp_path)

    def program(job, world):
        yield from world.compute(lambda: None, 0.1)
        if world.rank == 0:
            raise ValueError("a bug in rank 0's program")
        yield from world.all_reduce(torch.zeros(1))  # never completes: rank 0 is gone

    summary = sim.run(program)
    assert summary["status"] == "failed" and "a bug in rank 0" in summary["error"]
    events = read_events(tmp_path / "events.jsonl")
    assert events[-1]["event"] == "stop" and events[-1]["status"] == "failed"


@pytest.mark.parametrize("preset", ["sgp", "dpsgd"])
def test_gossip_waits_are_never_negative(tmp_path, preset):
    """A node's wait at the collective is the time it spent there beyond the collective's
    own cost: never below 0 (the per-engine simulator rounded one to −1.1e-16 s)."""
    from tests.conftest import run_job

    pause = "{worker:1,at_s:0.5,duration_s:0.4}"
    slow = "{worker:2,at_step:3,action:slow,delay_ms:40,duration_s:1}"
    run = run_job(
        tmp_path,
        [f"algorithm={preset}", "runtime=sim", "cluster=slow_network", "model=cnn",
         "dataset=mnist1d", "budget.max_wall_s=2", f"cluster.faults=[{pause},{slow}]"],
    )  # fmt: skip
    waits = [e["wait_s"] for e in run.events if e["kind"] == "update"]
    assert waits and min(waits) >= 0.0 and max(waits) > 0.3


def test_a_listener_takes_messages_in_arrival_order_and_hears_of_a_loss(tmp_path):
    """Rank 0 listens to 1, 2 and 3: rank 2 sends first in program order but arrives last;
    rank 3 dies at 0.25 s. The listener gets 1's message (0.1 s), then 3's loss as
    WorkerLost naming its peer (0.25 s), then 2's message (0.5 s); it pays no delay (a hub),
    the senders do (push latency, 7 ms)."""
    sim, seen = simulator(tmp_path, size=4), []
    push = sim.worlds[0].network.push_s(8)

    def program(job, world):
        if world.rank == 0:
            world.hub = True
            ear = world.listen({10: 1, 20: 2, 30: 3}, lambda rank: [])
            yield from world.begin(lambda: None)
            active = {10, 20, 30}
            while active:
                try:
                    peer, (buf,) = yield from ear.next(active)
                    seen.append((peer, buf.tolist(), world.now()))
                except RunError as lost:
                    peer = lost.worker
                    seen.append((peer, str(lost), world.now()))
                active.discard(peer)
            return finish(world)
        yield from world.begin(lambda: None)
        if world.rank == 3:
            yield from world.compute(lambda: None, 0.25)
            raise RunError("rank 3 is gone")
        yield from world.compute(lambda: None, {1: 0.1, 2: 0.5}[world.rank] - push)
        yield from world.isend(torch.tensor([float(world.rank), 0.0]), 0)
        return None

    assert sim.run(program)["status"] == "completed"
    assert [s[0] for s in seen] == [10, 30, 20]
    assert seen[0][1] == [1.0, 0.0] and seen[0][2] == pytest.approx(0.1)
    assert seen[1][1] == "rank 3 is gone" and seen[1][2] == pytest.approx(0.25)
    assert seen[2][1] == [2.0, 0.0] and seen[2][2] == pytest.approx(0.5)


def test_the_ps_server_stops_its_workers_and_counts_its_messages_in_the_simulator(tmp_path):
    """engine=ps's server is one program: at the end of a BSP run it tells each worker
    waiting for a reply to stop (a `stop` event each, at the end), as in real processes,
    and summary.json's bytes are its messages: every push in, every reply out."""
    from stalebench import experiment
    from stalebench.engines.ps.program import HEADER

    over = ["runtime=sim", "algorithm=bsp", "cluster.num_workers=4", "budget.max_updates=20"]
    cfg = compose(fast_with(over))
    cfg.run_dir = str(tmp_path)
    summary = experiment.run(cfg)
    events = read_events(tmp_path / "events.jsonl")
    end = [e for e in events if e.get("event") == "end"][0]
    stops = [e for e in events if e["kind"] == "worker" and e["event"] == "stop"]
    assert sorted(e["worker"] for e in stops) == [0, 1, 2, 3]
    assert {e["t"] for e in stops} == {end["t"]}
    d = sum(p.numel() for p in Job.build(cfg).model().parameters())
    pushes, replies = 20 * 4, 4 + 19 * 4  # the last round's replies are stops instead
    assert summary["bytes_sent"] == end["bytes_sent"] == (pushes + replies) * 4 * (HEADER + d)


def test_a_lazy_step_runs_when_its_message_is_read_and_never_if_it_is_not(tmp_path):
    """compute(lazy=True): the clock moves at once, the step runs only when the message the
    rank sent after it is read (rank 1's, read by rank 0) — or never (rank 2's, which
    rank 0 takes with read=False). The message carries what the step wrote."""
    sim, ran = simulator(tmp_path, size=3), []

    def program(job, world):
        if world.rank == 0:
            world.hub = True
            ear = world.listen({1: 1, 2: 2}, lambda rank: [])
            yield from world.begin(lambda: None)
            peer, (buf,) = yield from ear.next({1, 2})
            assert (peer, buf.tolist(), ran) == (1, [1.0], [1])
            peer, _ = yield from ear.next({2}, read=False)
            assert peer == 2 and ran == [1]
            return finish(world)
        yield from world.begin(lambda: None)
        out = torch.zeros(1)

        def step() -> None:
            ran.append(world.rank)
            out.fill_(float(world.rank))

        result, took = yield from world.compute(step, 0.1 * world.rank, lazy=True)
        assert (result, took, ran) == (None, 0.1 * world.rank, [])
        yield from world.isend(out, 0)
        return None

    assert sim.run(program)["status"] == "completed"
    assert ran == [1]


def test_a_message_carries_only_the_lazy_steps_not_yet_run(tmp_path):
    """A rank that only ever computes lazily and sends (a ps worker) never settles: each
    message must carry its own step, not every step since the start (which made the
    simulator quadratic in a run's pushes)."""
    sim, carried = simulator(tmp_path, size=2), []

    def program(job, world):
        if world.rank == 0:
            world.hub = True
            ear = world.listen({1: 1}, lambda rank: [])
            yield from world.begin(lambda: None)
            for _ in range(50):
                yield from ear.next({1})
                yield from world.send(torch.zeros(1), 1)
            return finish(world)
        yield from world.begin(lambda: None)
        for _ in range(50):
            yield from world.compute(lambda: None, 0.01, lazy=True)
            yield from world.isend(torch.zeros(1), 0)
            carried.append(len(sim.listeners[0].heap[0][4]))
            yield from world.recv(torch.zeros(1), 0)
        return None

    assert sim.run(program)["status"] == "completed"
    assert carried == [1] * 50


def test_a_ranks_collectives_run_one_after_another_and_complete_when_the_last_rank_comes(
    tmp_path,
):
    """all_reduce and all_gather with wait=False: each rank goes on computing; the first
    collective ends at the latest start plus its cost, the second starts when the first
    ends on that rank (as gloo runs a rank's collectives in order); `complete` returns the
    seconds waited, and the results are the rank-order sum and every rank's piece."""
    sim, seen = simulator(tmp_path, size=3), {}

    def program(job, world):
        r = world.rank
        yield from world.begin(lambda: None)
        yield from world.compute(lambda: None, 0.1 * r)  # rank r starts at 0.1·r
        total = torch.tensor([float(r + 1)])
        pieces = [torch.zeros(2) for _ in range(3)]
        first = yield from world.all_reduce(total, 0.5, wait=False)
        second = yield from world.all_gather(pieces, torch.tensor([r, 10.0 * r]), 0.25, False)
        yield from world.compute(lambda: None, 0.05)  # overlaps the collectives
        waited = [(yield from world.complete(first)), (yield from world.complete(second))]
        seen[r] = (total.item(), [p.tolist() for p in pieces], waited, world.now())
        return finish(world)

    assert sim.run(program)["status"] == "completed"
    for r, (total, pieces, waited, now) in seen.items():
        assert total == 1.0 + 2.0 + 3.0
        assert pieces == [[0.0, 0.0], [1.0, 10.0], [2.0, 20.0]]
        # the all-reduce ends at 0.2 + 0.5 (rank 2's start), the gather 0.25 after it
        assert now == pytest.approx(0.95)
        assert waited == pytest.approx([0.7 - (0.1 * r + 0.05), 0.25])


def test_a_cost_only_message_holds_its_header_is_charged_whole_and_forgotten_with_it(tmp_path):
    # sim.numerics=false: a message buffer (World.message) of 1,000 float32 slots holds its
    # 8 header slots, the wire charges its 4,000 bytes, and the simulator keeps no record of
    # it once the buffer is gone (a pipeline makes one for every message)
    sim = simulator(tmp_path, "sim.numerics=false")
    buf = sim.buffer(1000, 8)
    assert buf.numel() == 8 and sim.nbytes(buf) == 4000 and len(sim.wire) == 1
    del buf
    assert sim.wire == {}
    assert simulator(tmp_path / "values").buffer(1000, 8).numel() == 1000  # with values: whole
