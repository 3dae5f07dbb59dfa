"""DSSP against its definition (docs/algorithms.md §5, §12, A-DSSP-1/2)."""

import heapq
import random

import pytest
import torch

from stalebench.algorithms.barriers import SSP, SSPConfig
from stalebench.algorithms.dssp import DSSP, DSSPConfig, sync_controller
from stalebench.algorithms.updates import SGD, SGDConfig
from stalebench.engines.ps import ParameterServer, Push
from stalebench.errors import ConfigError


def dssp(n=2, s_low=1, s_high=6, **kw) -> DSSP:
    return DSSP(DSSPConfig(name="dssp", s_low=s_low, s_high=s_high, **kw), num_workers=n)


def record(barrier) -> list[dict]:
    events = []
    barrier.emit = lambda kind, t, **f: events.append({"kind": kind, "t": t, **f})
    return events


class Driver:
    """The engine's calling order without the engine: count the push, observe it, then
    re-check every held worker (the pusher last) in arrival order."""

    def __init__(self, barriers, n):
        self.barriers, self.clocks, self.held = barriers, [0] * n, list(range(n))
        self.admitted_gaps: list[int] = []
        self.release()

    def push(self, w: int, now: float) -> list[int]:
        assert w not in self.held, f"worker {w} is held and cannot push"
        self.clocks[w] += 1
        for b in self.barriers:
            b.observe_push(w, self.clocks, now)
        self.held.append(w)
        return self.release()

    def release(self) -> list[int]:
        out = []
        for w in list(self.held):
            decisions = [b.admit(w, self.clocks, min(self.clocks)) for b in self.barriers]
            assert len(set(decisions)) == 1, (w, self.clocks, decisions)
            if decisions[0]:
                self.held.remove(w)
                self.admitted_gaps.append(self.clocks[w] - min(self.clocks))
                out.append(w)
        assert len(self.held) < len(self.clocks), f"deadlock at {self.clocks}"
        return out


def simulate(barriers, step_s, pushes, seed, jitter=0.5):
    """Workers with mean step times `step_s` (± jitter), run event by event for `pushes`."""
    rng = random.Random(seed)
    driver = Driver(barriers, len(step_s))
    queue = [(step_s[w] * rng.uniform(1 - jitter, 1 + jitter), w) for w in range(len(step_s))]
    heapq.heapify(queue)
    for _ in range(pushes):
        now, w = heapq.heappop(queue)
        for r in driver.push(w, now):
            heapq.heappush(queue, (now + step_s[r] * rng.uniform(1 - jitter, 1 + jitter), r))
    return driver


def test_config_errors_name_the_key_and_the_value():
    with pytest.raises(ConfigError, match=r"algorithm\.barrier\.s_low must be >= 0, got -1"):
        DSSPConfig(name="dssp", s_low=-1)
    with pytest.raises(ConfigError, match=r"algorithm\.barrier\.s_high.*s_low \(3\), got 2"):
        DSSPConfig(name="dssp", s_low=3, s_high=2)
    with pytest.raises(ConfigError, match=r"algorithm\.barrier\.controller.*'multi'.*'merge'"):
        DSSPConfig(name="dssp", controller="merge")
    DSSPConfig(name="dssp", s_low=0, s_high=0, controller="multi")  # the degenerate range is fine


@pytest.mark.parametrize("s", [0, 1, 3])
@pytest.mark.parametrize("controller", ["next_push", "multi"])
@pytest.mark.parametrize("consumes", [False, True])
def test_equal_bounds_admit_exactly_as_ssp(s, controller, consumes):
    """§12: s_low = s_high leaves no extra steps to grant, so DSSP is SSP(s_low)."""
    for seed in range(5):
        rng = random.Random(seed)
        n = rng.randint(2, 5)
        barriers = [
            dssp(n, s, s, controller=controller, grant_consumes_ok=consumes),
            SSP(SSPConfig(name="ssp", staleness=s), n),
        ]
        speeds = [rng.uniform(0.2, 2.0) for _ in range(n)]
        simulate(barriers, speeds, pushes=300, seed=seed)  # Driver asserts equal decisions


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((1.0, 1.0, 3.0, 3.0, 12), (5, 0.0)),  # T_q = 6 = T_p(5)
        ((1.0, 1.0, 3.0, 3.0, 3), (3, 2.0)),  # r_max caps it; p still 2 s early
        ((1.0, 1.0, 3.0, 3.0, 0), (0, 5.0)),
        ((4.0, 1.0, 3.0, 3.0, 12), (2, 0.0)),
        ((4.5, 1.0, 3.0, 3.0, 12), (1, 0.5)),  # |−0.5| = |0.5|: the smaller k wins
        ((7.0, 1.0, 3.0, 3.0, 12), (0, 1.0)),  # p is already past q's next push
        ((1.0, 0.0, 3.0, 3.0, 12), (0, 5.0)),  # no interval: extra steps gain nothing
    ],
)
def test_controller_against_hand_computed_cases(args, expected):
    assert sync_controller(*args) == expected


def test_multi_controller_aims_at_later_pushes_of_the_slowest():
    # p every 1 s from 1.0; q every 2.5 s from 3.0: q's next push at 5.5 lies between
    # T_p(4) = 5 and T_p(5) = 6, but its push after that, 8.0, is T_p(7) exactly.
    assert sync_controller(1.0, 1.0, 3.0, 2.5, 12) == (4, 0.5)
    assert sync_controller(1.0, 1.0, 3.0, 2.5, 12, multi=True) == (7, 0.0)
    # r_max also bounds the pushes of q it looks at: j = 1..r_max + 1
    assert sync_controller(1.0, 1.0, 3.0, 2.5, 5, multi=True) == (4, 0.5)


def run_hand_sequence(**kw):
    """Two workers, s_low = 1, s_high = 6: q (1) pushes every 3 s, p (0) every 1 s, from t = 4
    on p alone pushes until it is held. Returns the events, how many of those pushes were
    admitted, the barrier and the driver."""
    barrier = dssp(2, 1, 6, **kw)
    events = record(barrier)
    d = Driver([barrier], 2)
    for w, t in [(1, 0.0), (0, 1.0), (0, 2.0), (1, 3.0), (0, 3.0)]:
        assert w in d.push(w, t)  # all within s_low
    assert events == []
    t = 4.0
    while d.push(0, t):
        t += 1.0
    return events, int(t) - 4, barrier, d


def test_the_fastest_worker_gets_extra_steps_and_the_decision_is_logged():
    events, admitted, barrier, d = run_hand_sequence()
    # at t = 4 p is 2 ahead (> s_low): I_p = 1, T_q = 3 + 3 = 6 = T_p(2), so r* = 2
    assert events[0] == {
        "kind": "barrier",
        "t": 4.0,
        "worker": 0,
        "event": "dssp_grant",
        "extra": 2,
        "predicted_wait_s": 0.0,
        "clock_gap": 2,
    }
    # OK now (gap 2) and two more (gaps 3, 4); at t = 7 (gap 5) T_q = 6 is already past
    assert admitted == 3
    assert [(e["t"], e["extra"], e["predicted_wait_s"], e["clock_gap"]) for e in events[1:]] == [
        (7.0, 0, 1.0, 5)
    ]
    assert barrier.grants == 1 and barrier.bound_holds == 0
    # held at gap 5, it starts again only at gap ≤ s_low: after four pushes of q
    assert d.clocks == [7, 2] and d.held == [0]
    for _ in range(3):
        assert d.push(1, 10.0) == [1]
    assert d.push(1, 10.0) == [0, 1] and d.clocks == [7, 6]


def test_consuming_the_ok_grants_one_extra_step_fewer():
    """A-DSSP-1: the same r* = 2 gives steps at gaps 2, 3, 4 (paper) or 2, 3 (consuming)."""
    events, admitted, _, _ = run_hand_sequence(grant_consumes_ok=False)
    events_c, admitted_c, _, d = run_hand_sequence(grant_consumes_ok=True)
    assert events_c[0]["extra"] == events[0]["extra"] == 2
    assert (admitted, admitted_c) == (3, 2)
    # consuming: r = 0 at t = 6 (gap 4) and T_q = 6 = T_p(0): no new grant
    assert [(e["t"], e["extra"], e["clock_gap"]) for e in events_c[1:]] == [(6.0, 0, 4)]
    assert d.clocks == [6, 2]


def test_a_worker_that_is_not_the_fastest_waits_for_s_low_without_a_decision():
    for ahead, decisions in [(3, 0), (2, 1)]:  # worker 0 ahead of worker 1, or tied with it
        barrier = dssp(3, 1, 5)
        events = record(barrier)
        barrier.observe_push(1, [ahead, 1, 0], 0.0)
        assert barrier.admit(1, [ahead, 1, 0], min([ahead, 1, 0]))
        barrier.observe_push(1, [ahead, 2, 0], 1.0)  # 2 ahead of the slowest
        assert len(events) == decisions  # the controller runs for the fastest worker only
        assert [e["worker"] for e in events] == [1] * decisions
        assert not barrier.admit(1, [ahead, 2, 0], min([ahead, 2, 0]))
        assert barrier.admit(1, [ahead, 2, 1], min([ahead, 2, 1]))


def test_no_grant_before_both_workers_have_two_push_times():
    barrier = dssp(2, 0, 10)
    events = record(barrier)
    d = Driver([barrier], 2)
    assert d.push(0, 1.0) == []  # clocks [1, 0]: fastest, but one push time only
    assert events[0]["extra"] == 0 and events[0]["predicted_wait_s"] is None
    assert d.push(1, 5.0) == [0, 1]
    assert d.push(0, 6.0) == []  # p has an interval, q has not
    assert events[1]["extra"] == 0 and events[1]["predicted_wait_s"] is None


@pytest.mark.parametrize("consumes", [False, True])
def test_grant_is_limited_to_the_room_below_s_high(consumes):
    """From gap 1 with s_high = 2 the controller may grant at most 2 − 1 = 1 step (r_max = 2
    alone would allow 2): T_q = 20, T_p(k) = 11 + k, so r* = 1 with predicted wait 8. The
    paper's non-consuming OK then starts steps at gaps 1 and 2; consuming, only at gap 1.
    Either way no step starts past s_high and the safety clamp in admit never fires."""
    barrier = dssp(2, 0, 2, grant_consumes_ok=consumes)
    events = record(barrier)
    d = Driver([barrier], 2)
    for w, t in [(1, 0.0), (0, 0.0), (1, 10.0), (0, 10.0)]:
        d.push(w, t)
    assert d.clocks == [2, 2] and d.held == []
    assert d.push(0, 11.0) == [0]  # gap 1
    assert events[-1]["extra"] == 1 and events[-1]["predicted_wait_s"] == 8.0
    assert d.push(0, 12.0) == ([] if consumes else [0])  # gap 2 = s_high
    if not consumes:
        assert d.push(0, 13.0) == []  # gap 3 > s_high: no room, r* = 0, wait
        assert events[-1]["extra"] == 0
    assert barrier.bound_holds == 0
    assert max(e["extra"] for e in events) <= 1


@pytest.mark.parametrize("controller", ["next_push", "multi"])
@pytest.mark.parametrize("consumes", [False, True])
def test_gap_at_admission_stays_within_s_high_with_heterogeneous_speeds(controller, consumes):
    above_low = held_at_bound = 0
    for seed in range(6):
        rng = random.Random(seed)
        n = rng.randint(2, 5)
        s_low, s_high = rng.randint(0, 2), rng.randint(3, 6)
        barrier = dssp(n, s_low, s_high, controller=controller, grant_consumes_ok=consumes)
        speeds = [rng.choice([0.25, 1.0, 3.0]) for _ in range(n)]
        speeds[0] = 0.25  # at least one fast worker
        speeds[-1] = 3.0  # and one straggler
        d = simulate([barrier], speeds, pushes=400, seed=seed, jitter=0.2)
        assert min(d.admitted_gaps) >= 0 and max(d.admitted_gaps) <= s_high, d.admitted_gaps
        above_low += sum(g > s_low for g in d.admitted_gaps)
        held_at_bound += barrier.bound_holds
    assert above_low > 0  # the range is used, not just its lower end
    assert held_at_bound == 0  # grants never exceed the room, so the clamp never fires


def test_through_the_parameter_server_a_3x_faster_worker_stays_within_s_high():
    n, s_low, s_high = 3, 1, 4
    events = []
    params = torch.zeros(2)
    barrier = dssp(n, s_low, s_high)
    ps = ParameterServer(
        params,
        barrier,
        SGD(SGDConfig(name="sgd", lr=0.1), params, n),
        n,
        lambda kind, t, **f: events.append({"kind": kind, "t": t, **f}),
    )
    step_s = [1.0, 3.0, 3.0]  # worker 0 is 3× faster; ties in time go to the lower index
    queue, version_read = [], {}

    def start(replies, now):
        for r in replies:
            version_read[r.worker] = r.version
            heapq.heappush(queue, (now + step_s[r.worker], r.worker))

    start(ps.start(0.0), 0.0)
    gaps = []
    for _ in range(300):
        now, w = heapq.heappop(queue)
        grad = torch.full((2,), 0.01)
        push = Push(w, ps.clocks[w], version_read[w], grad, loss=1.0, compute_s=step_s[w], rtt_s=0)
        start(ps.on_push(push, now), now)  # raises RunError on a deadlock
        gaps.append(list(ps.gap))
    updates = [e for e in events if e["kind"] == "update"]
    grants = [e for e in events if e["kind"] == "barrier"]
    assert len(updates) == 300
    assert all(0 <= e["clock_gap"] <= s_high for e in updates)
    assert all(0 <= g <= s_high for row in gaps for g in row)
    assert any(e["clock_gap"] > s_low for e in updates)  # worker 0 did use extra steps
    assert grants and all(e["worker"] == 0 and e["event"] == "dssp_grant" for e in grants)
    assert any(e["extra"] > 0 for e in grants)
    assert ps.clocks[0] > max(ps.clocks[1:]) and max(ps.clocks) - min(ps.clocks) <= s_high + 1


def test_bound_at_s_high_is_a_flag_and_the_default():
    """A-DSSP-3: the bound keeps the threshold in [s_low, s_high] unless switched off."""
    assert DSSPConfig(name="dssp").bound_at_s_high is True
    assert dssp(2, 0, 2, bound_at_s_high=False).bounded is False


def test_without_the_bound_the_literal_procedure_grants_r_max_and_renews_past_s_high():
    """The server procedure taken literally (bound_at_s_high=false), on the hand sequence of
    test_grant_is_limited_to_the_room_below_s_high: s_low = 0, s_high = 2 (r_max = 2), q's
    next push predicted at T_q = 20, p pushing every second from t = 11.
    - t = 11, gap 1: the controller searches all of [0, r_max]: T_p(k) = 11 + k, r* = 2
      (wait 7), where the bound allowed only 1. OK now, then two granted steps: the steps
      at gaps 2 and 3 start, the one at gap 3 past s_high.
    - t = 14, gap 4: the grant is used up, p is still the fastest and beyond s_low, so the
      controller grants again (T_p(k) = 14 + k, r* = 2, wait 4): gaps 4, 5, 6 ...
    - ... until p's next push would pass T_q: at t = 20, gap 10, T_p(0) = 20 = T_q, r* = 0,
      and p waits for gap ≤ s_low."""
    barrier = dssp(2, 0, 2, bound_at_s_high=False)
    events = record(barrier)
    d = Driver([barrier], 2)
    for w, t in [(1, 0.0), (0, 0.0), (1, 10.0), (0, 10.0)]:
        d.push(w, t)
    assert d.clocks == [2, 2] and d.held == []
    admitted, t = [], 11.0
    while d.push(0, t) == [0]:
        admitted.append(d.clocks[0] - d.clocks[1])
        t += 1.0
    assert admitted == [1, 2, 3, 4, 5, 6, 7, 8, 9]  # steps start up to 9 past the slowest
    assert t == 20.0 and d.clocks == [12, 2] and d.held == [0]
    decisions = [e for e in events if e["t"] >= 11.0]  # the set-up pushes' r* = 0 aside
    assert [(e["t"], e["extra"], e["predicted_wait_s"], e["clock_gap"]) for e in decisions] == [
        (11.0, 2, 7.0, 1),
        (14.0, 2, 4.0, 4),
        (17.0, 2, 1.0, 7),
        (20.0, 0, 0.0, 10),
    ]
    assert barrier.grants == 3 and barrier.bound_holds == 0  # no bound, nothing deferred
    # the same pushes with the bound: one grant of 1, then held at gap 3 (> s_high)
    bounded = dssp(2, 0, 2)
    d = Driver([bounded], 2)
    for w, tt in [(1, 0.0), (0, 0.0), (1, 10.0), (0, 10.0)]:
        d.push(w, tt)
    assert [d.push(0, tt) for tt in (11.0, 12.0, 13.0)] == [[0], [0], []]
    assert d.clocks == [5, 2] and max(d.admitted_gaps) <= 2


@pytest.mark.parametrize("consumes", [False, True])
def test_without_the_bound_a_persistently_fastest_worker_runs_past_s_high(consumes):
    """Under persistent heterogeneity the literal procedure lets the fast worker drift past
    s_high (renewed grants); the bounded default never does (the property test above)."""
    past = 0
    for seed in range(4):
        barrier = dssp(3, 1, 4, bound_at_s_high=False, grant_consumes_ok=consumes)
        d = simulate([barrier], [0.25, 3.0, 3.0], pushes=400, seed=seed, jitter=0.2)
        past += sum(g > 4 for g in d.admitted_gaps)
        assert barrier.bound_holds == 0
    assert past > 0
