"""The parameter server's checkpoint state is the whole of it: a server rebuilt from
`state()` (through torch.save and the checkpoint's safe loader, `checkpoint.read`, as a
checkpoint goes to disk and comes back) and one that
simply goes on, both restarted in place (`start`: the workers in flight read θ again, as a
resumed run's do), compute bit-identical parameters, replies and events for every
algorithm on the parameter-server engine. A field missing from the state (a momentum
buffer, a random stream, a clock, a round in progress) makes them differ."""

from __future__ import annotations

import io

import pytest
import torch

from stalebench.algorithms.base import BARRIERS, UPDATES
from stalebench.engines.ps import ParameterServer, Push
from stalebench.errors import RunError
from stalebench.runtime import checkpoint
from tests.conftest import compose, fast_with

N = 3
PS_PRESETS = [
    "asp",
    "bsp",
    "ssp",
    "dssp",
    "psp",
    "gap_aware",
    "staleness_aware",
    "dc_asgd",
    "multi_asgd",
    "nag_asgd",
    "dana",
]


# and every registered barrier (behind plain SGD) and update rule (behind ASP), so that a
# part's state that the safe loader cannot rebuild (a helper class not marked `stored`)
# fails here
PARTS = [f"algorithm/barrier={b} algorithm/update=sgd" for b in BARRIERS.names()] + [
    f"algorithm/barrier=asp algorithm/update={u}" for u in UPDATES.names()
]


def build(preset: str, extra: list[str]) -> tuple[ParameterServer, list]:
    chosen = preset.split() if "=" in preset else [f"algorithm={preset}"]
    overrides = [*chosen, f"cluster.num_workers={N}", "budget.max_updates=9"]
    cfg = compose(fast_with([*overrides, *extra]))
    a = cfg.algorithm
    params = torch.linspace(-1.0, 1.0, 7)
    events: list = []
    ps = ParameterServer(
        params,
        BARRIERS.build(a.barrier, N, cfg.seed),
        UPDATES.build(a.update, params, N),
        N,
        lambda kind, t, **fields: events.append((kind, t, fields)),
    )
    return ps, events


class Driver:
    """Workers that push, in a fixed order, a gradient that depends on what they read."""

    def __init__(self, ps: ParameterServer):
        self.ps, self.ready, self.t = ps, {}, 0.0

    def take(self, replies) -> None:
        for r in replies:
            self.ready[r.worker] = (r.version, r.params.clone())

    def step(self) -> None:
        w = min(self.ready, key=lambda w: (self.ps.clocks[w], w))
        version, read = self.ready.pop(w)
        clock = self.ps.clocks[w]
        grad = torch.sin(read * (w + 2) + clock) + 0.1 * w
        self.t += 0.25 + 0.125 * w
        push = Push(w, clock, version, grad, loss=1.0, compute_s=0.1, rtt_s=0.01)
        self.take(self.ps.on_push(push, self.t))


def through_disk(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return checkpoint.read(buf, "state")


@pytest.mark.parametrize("preset", PS_PRESETS + PARTS)
def test_a_server_rebuilt_from_its_state_goes_on_as_the_original(preset):
    momentum = preset in ("nag_asgd", "dana") or "update=momentum" in preset
    extra = ["algorithm.update.momentum=0.5"] if momentum else []
    original, seen = build(preset, extra)
    driver = Driver(original)
    driver.take(original.start(0.0))
    for _ in range(17):  # a round in progress for the per-round barriers (17 = 5·3 + 2)
        driver.step()
    assert original.version > 0

    rebuilt, seen_rebuilt = build(preset, extra)
    rebuilt.resume(through_disk(original.state()))
    assert rebuilt.params is not original.params

    copy = Driver(rebuilt)
    copy.t = driver.t
    original.held, driver.ready = {}, {}  # both restart in place, as a resumed run does
    driver.take(original.start(driver.t))
    copy.take(rebuilt.start(copy.t))
    assert sorted(copy.ready) == sorted(driver.ready)
    seen.clear()
    for _ in range(30):
        driver.step()
        copy.step()
    assert torch.equal(rebuilt.params, original.params)
    assert rebuilt.version == original.version and rebuilt.clocks == original.clocks
    assert seen_rebuilt == seen  # the same updates, lags, waits and barrier events
    for w in range(N):
        assert torch.equal(copy.ready[w][1], driver.ready[w][1]) if w in driver.ready else True


def test_the_state_omits_the_event_log_and_the_held_workers():
    ps, _ = build("ssp", [])
    Driver(ps).take(ps.start(0.0))
    state = ps.state()
    assert "emit" not in state and "held" not in state
    assert state["barrier"].emit is None and ps.barrier.emit is not None
    restored, seen = build("ssp", [])
    restored.resume(through_disk(state))
    assert restored.held == {}
    restored.barrier.emit("barrier", 1.0, note="x")  # the new server's log, not the old one's
    assert seen == [("barrier", 1.0, {"note": "x"})]


def test_a_worker_lost_before_the_checkpoint_stays_out():
    ps, _ = build("asp", [])
    driver = Driver(ps)
    driver.take(ps.start(0.0))
    driver.step()
    ps.lose(1, 0.5)
    rebuilt, _ = build("asp", [])
    rebuilt.resume(through_disk(ps.state()))
    assert rebuilt.lost == {1}
    assert sorted(r.worker for r in rebuilt.start(5.0)) == [0, 2]


@pytest.mark.parametrize("preset", ["asp", "dana", "gap_aware"])
def test_a_lost_workers_place_taken_again_reads_the_current_theta_from_its_clock(preset):
    ps, _ = build(preset, [])
    driver = Driver(ps)
    driver.take(ps.start(0.0))
    for _ in range(5):
        driver.step()
    driver.ready.pop(1, None)  # worker 1 is gone with what it read
    clock = ps.clocks[1]
    assert ps.lose(1, 2.0) == [] and ps.lost == {1}
    (reply,) = ps.rejoin(1, 2.5)
    assert (reply.worker, reply.version) == (1, ps.version) and ps.lost == set()
    assert torch.equal(reply.params, ps.rule.params_for(ps.params, 1))
    assert ps.wait_s[1] == 0.0 and ps.clocks[1] == clock  # it goes on from its clock
    driver.take([reply])
    for _ in range(4):
        driver.step()
    assert ps.clocks[1] > clock


@pytest.mark.parametrize("preset", ["bsp", "ssp"])
def test_only_a_barrier_that_never_waits_takes_a_worker_back(preset):
    ps, _ = build(preset, ["algorithm.barrier.on_loss=reform"])
    ps.start(0.0)
    ps.lose(1, 1.0)
    with pytest.raises(RunError, match=r"worker 1 cannot rejoin \(lost: \[1\]\)"):
        ps.rejoin(1, 2.0)
    asp, _ = build("asp", [])
    with pytest.raises(RunError, match=r"worker 2 cannot rejoin \(lost: \[\]\)"):
        asp.rejoin(2, 2.0)
