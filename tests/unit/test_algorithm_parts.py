"""The parts DANA and DSSP are built from: DANA's variant (where the momentum lives, what is
sent) is one object chosen when the rule is built; DSSP's grant controller (push times and
the r* decision) stands on its own, apart from the barrier's admission bookkeeping."""

import pytest
import torch

from stalebench.algorithms.dana import (
    Dana,
    DanaConfig,
    DanaGapAware,
    DanaGapAwareConfig,
    DelayCompensated,
    ServerMomentum,
    WorkerMomentum,
)
from stalebench.algorithms.dssp import DSSP, DSSPConfig, GrantController


@pytest.mark.parametrize(
    "variant, part, keeps_sent",
    [
        ("zero", ServerMomentum, False),
        ("dc", DelayCompensated, True),
        ("slim", WorkerMomentum, False),
    ],
)
def test_dana_picks_its_variant_once(variant, part, keeps_sent):
    theta = torch.tensor([1.0, -2.0])
    rule = Dana(DanaConfig(name="dana", variant=variant), theta, 3)
    assert type(rule.variant) is part
    assert (rule.sent is not None) == keeps_sent
    if variant == "slim":  # the server keeps no per-worker state
        assert not hasattr(rule, "bufs") and not hasattr(rule, "buf_sum")
        assert rule.params_for(theta, 0) is theta  # Φ is the look-ahead
    else:
        assert rule.bufs.shape == (3, 2) and rule.buf_sum.shape == (2,)
    if keeps_sent:
        assert torch.equal(rule.sent, theta.expand(3, 2))  # θ̂_i = θ₀ until sent


def test_dana_ga_keeps_the_look_aheads_sent_in_either_variant():
    theta = torch.zeros(2)
    for variant, part in (("zero", ServerMomentum), ("dc", DelayCompensated)):
        rule = DanaGapAware(DanaGapAwareConfig(name="dana_ga", variant=variant), theta, 2)
        assert type(rule.variant) is part and rule.sent.shape == (2, 2)


def test_dana_worker_message_is_the_variants():
    g = torch.tensor([1.0, -2.0])
    for variant in ("zero", "dc"):
        assert Dana.worker_message(DanaConfig(name="dana", variant=variant), g, {}) is g
    state: dict = {}
    slim = DanaConfig(name="dana", variant="slim", momentum=0.5)
    assert torch.equal(Dana.worker_message(slim, g, state), g * 1.5)  # v = g; m = 0.5·v + g
    assert torch.equal(state["v"], g)


def test_grant_controller_keeps_the_last_two_push_times():
    c = GrantController(DSSPConfig(name="dssp", s_low=1, s_high=6), num_workers=2)
    for t in (0.0, 1.0, 2.0):
        c.record(0, t)
    assert c.push_times == [[1.0, 2.0], []]
    assert c.decide(0, [3, 0], gap=3) == (0, None)  # q has no interval yet


def test_grant_controller_aims_at_the_slowest_workers_next_push():
    # p (0) pushed at 3 and 4 (I_p = 1); q (1) at 0 and 3 (I_q = 3): T_q = 6 = T_p(2)
    c = GrantController(DSSPConfig(name="dssp", s_low=1, s_high=6), num_workers=3)
    for w, t in [(1, 0.0), (2, 0.0), (1, 3.0), (2, 2.0), (0, 3.0), (0, 4.0)]:
        c.record(w, t)
    assert c.decide(0, [4, 2, 2], gap=2) == (2, 0.0)  # a tie for slowest: the lowest index
    # the room left below s_high caps the search: gap 5 leaves one extra step
    assert c.decide(0, [7, 2, 2], gap=5) == (1, 1.0)
    assert c.decide(0, [8, 2, 2], gap=6) == (0, 2.0)


def test_dssp_asks_its_controller_and_logs_the_answer():
    barrier = DSSP(DSSPConfig(name="dssp", s_low=0, s_high=4), num_workers=2)
    asked, events = [], []
    barrier.emit = lambda kind, t, **f: events.append(f)

    def decide(p, clocks, gap):
        asked.append((p, list(clocks), gap))
        return 3, 0.25

    barrier.controller.decide = decide
    barrier.observe_push(0, [1, 0], now=1.0)
    assert asked == [(0, [1, 0], 1)]
    assert events == [
        {"worker": 0, "event": "dssp_grant", "extra": 3, "predicted_wait_s": 0.25, "clock_gap": 1}
    ]
    assert barrier.grants == 1 and barrier.remaining[0] == 3 and barrier.ok_step[0] == 1
