"""The slow_compute fault: a worker's profile step times multiplied by its factor from its
step at_step on, for duration_steps steps (0: to the end). The profile's draws carry it, so
the draws themselves (the seeded streams) do not move, and the runtime's fault wrappers
(pause, die, slow) never strike it."""

import numpy as np
import pytest

from stalebench.cluster import ClusterConfig, FaultConfig, Profile
from stalebench.runtime.faults import Faults

# random step times and transient stragglers: every draw differs, so a shifted stream or a
# factor on the wrong step shows
NOISY = dict(num_workers=3, compute="gamma", compute_ms=10, gamma_shape=4, straggler_prob=0.2)


def slowed(worker=1, at_step=5, factor=3.0, duration_steps=0):
    return FaultConfig(
        worker=worker,
        action="slow_compute",
        at_step=at_step,
        factor=factor,
        duration_steps=duration_steps,
    )


def draws(faults=(), seed=7, steps=30):
    p = Profile(ClusterConfig(name="profile", faults=list(faults), **NOISY), seed)
    return {w: np.array([p.step_s(w) for _ in range(steps)]) for w in range(3)}


def test_the_draws_are_the_unfaulted_ones_times_the_factor_from_the_step_on():
    plain, fault = draws(), draws([slowed(worker=1, at_step=5, factor=3.0)])
    assert len(set(plain[1])) == 30  # every step time its own
    np.testing.assert_array_equal(fault[1][:5], plain[1][:5])
    np.testing.assert_array_equal(fault[1][5:], plain[1][5:] * 3.0)  # to the end of the run
    for w in (0, 2):  # the other workers' streams are untouched
        np.testing.assert_array_equal(fault[w], plain[w])


def test_a_slow_compute_fault_lasts_its_duration_in_steps():
    plain = draws()
    fault = draws([slowed(worker=2, at_step=0, factor=1.5, duration_steps=4)])
    np.testing.assert_array_equal(fault[2][:4], plain[2][:4] * 1.5)
    np.testing.assert_array_equal(fault[2][4:], plain[2][4:])


def test_overlapping_slow_compute_faults_multiply():
    plain = draws()
    fault = draws(
        [slowed(worker=0, at_step=2, factor=2.0), slowed(worker=0, at_step=4, factor=3.0)]
    )
    expected = plain[0] * np.array([1.0] * 2 + [2.0] * 2 + [6.0] * 26)
    np.testing.assert_allclose(fault[0], expected, rtol=1e-15)


def test_the_fault_wrappers_never_strike_a_slow_compute_fault():
    p = Profile(
        ClusterConfig(
            name="profile",
            num_workers=2,
            compute_ms=10,
            faults=[
                slowed(worker=1, at_step=0, factor=3.0),
                FaultConfig(worker=1, at_step=2, action="pause", duration_s=0.5),
            ],
        )
    )
    faults = Faults(p, 1)
    pauses = []
    starts = [faults.strike(float(k), lambda at, s: pauses.append((at, s))) for k in range(4)]
    # the pause strikes at step 2 as before; slow_compute neither pauses nor slows messages
    assert pauses == [(2.0, 0.5)] and starts == [0.0, 1.0, 2.5, 3.0]
    assert faults.slow_s == 0.0
    # its only effect is on the step times
    assert [p.step_s(1) for _ in range(2)] == pytest.approx([0.03, 0.03])
    assert p.step_s(0) == pytest.approx(0.01)


def test_a_spare_or_a_resumed_worker_keeps_the_slowdown_at_its_step():
    """The factor belongs to the worker's step index: a process that skips the draws of the
    steps taken before (a resumed run, a spare in a lost worker's place) sees it at the same
    steps as an uninterrupted one."""
    cfg = ClusterConfig(name="profile", faults=[slowed(worker=1, at_step=5)], **NOISY)
    whole = Profile(cfg, 3)
    uninterrupted = [whole.step_s(1) for _ in range(10)]
    resumed = Profile(cfg, 3)
    for _ in range(4):
        resumed.step_s(1)  # skipped: the steps the earlier run took
    assert [resumed.step_s(1) for _ in range(6)] == uninterrupted[4:]
