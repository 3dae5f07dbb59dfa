"""DSSP: a staleness threshold that moves inside [s_low, s_high] (docs/algorithms.md §5)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from stalebench.algorithms.base import BARRIERS, Barrier, BarrierConfig
from stalebench.errors import ConfigError
from stalebench.registry import stored

CONTROLLERS = ("next_push", "multi")


@dataclasses.dataclass
class DSSPConfig(BarrierConfig):
    s_low: int = 3  # s_L: every worker may run this many steps ahead of the slowest
    s_high: int = 15  # s_U: never more than this many (r_max = s_high − s_low extra steps)
    # A-DSSP-1: does the OK sent with a grant of r* extra steps use up one of them?
    # False = the paper's "OK now, then decrement on each later push" (r* + 1 steps in all)
    grant_consumes_ok: bool = False
    # A-DSSP-2: next_push = aim at the slowest worker's next push (the paper);
    # multi = aim at the nearest of its next r_max + 1 pushes (third-party TF code)
    controller: str = "next_push"
    # A-DSSP-3: keep the effective threshold in [s_low, s_high], the range the paper says
    # the controller picks from (a grant never reaches past s_high). False: the server
    # procedure taken literally: each grant up to r_max, renewed whenever the fastest
    # worker's grant runs out beyond s_low, so a persistently fastest worker can run any
    # number of steps past s_high (docs/algorithms.md §5.5)
    bound_at_s_high: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.s_low < 0:
            raise ConfigError(f"algorithm.barrier.s_low must be >= 0, got {self.s_low}")
        if self.s_high < self.s_low:
            raise ConfigError(
                f"algorithm.barrier.s_high must be >= algorithm.barrier.s_low ({self.s_low}), "
                f"got {self.s_high}"
            )
        if self.controller not in CONTROLLERS:
            raise ConfigError(
                "algorithm.barrier.controller must be 'next_push' or 'multi', "
                f"got {self.controller!r}"
            )


def sync_controller(
    last_p: float,
    interval_p: float,
    last_q: float,
    interval_q: float,
    r_max: int,
    multi: bool = False,
) -> tuple[int, float]:
    """The paper's SyncController: the number of extra steps r* ∈ [0, r_max] after which the
    fastest worker p would push closest in time to a push of the slowest worker q, and that
    predicted idle time |T_p(r*) − T_q|. T_p(k) = last_p + k·I_p; T_q = last_q + I_q, or with
    `multi` the nearest of last_q + j·I_q, j = 1..r_max + 1. Ties go to the smaller k."""
    targets = [last_q + j * interval_q for j in range(1, (r_max + 1 if multi else 1) + 1)]
    best_k, best_wait = 0, float("inf")
    for k in range(r_max + 1):
        t_p = last_p + k * interval_p
        wait = min(abs(t_p - t_q) for t_q in targets)
        if wait < best_wait:  # strict: the smallest k wins a tie
            best_k, best_wait = k, wait
    return best_k, best_wait


@stored
class GrantController:
    """How many extra steps r* to grant the fastest worker p when it is past s_low (§5.2):
    from the last two push times of p and of the slowest worker q, the r* ≤ r_max after which
    p would push closest to q's next push (`sync_controller`), searching only the room left
    below s_high so that the effective threshold stays in [s_low, s_high] (or all of
    [0, r_max] with `bound_at_s_high=false`, the server procedure taken literally)."""

    def __init__(self, cfg: DSSPConfig, num_workers: int):
        self.s_high = cfg.s_high
        self.r_max = cfg.s_high - cfg.s_low
        self.bounded = cfg.bound_at_s_high
        self.multi = cfg.controller == "multi"
        # the last two push times of each worker (server clock, seconds), newest last
        self.push_times: list[list[float]] = [[] for _ in range(num_workers)]

    def record(self, worker: int, now: float) -> None:
        times = self.push_times[worker]
        times.append(now)
        del times[:-2]

    def decide(self, p: int, clocks: Sequence[int], gap: int) -> tuple[int, float | None]:
        """(r*, the predicted wait |T_p(r*) − T_q| or None before both have an interval)."""
        slowest = min(clocks)
        q = next(i for i, c in enumerate(clocks) if c == slowest)  # ties: lowest index
        tp, tq = self.push_times[p], self.push_times[q]
        if len(tp) < 2 or len(tq) < 2:  # no interval to predict from yet
            return 0, None
        # Grant only what keeps the step within s_high: the effective threshold stays in
        # [s_low, s_high] by construction (the paper's r_max alone would let a fastest
        # worker be re-granted after each grant ran out, without bound).
        room = min(self.r_max, self.s_high - gap) if self.bounded else self.r_max
        return sync_controller(tp[1], tp[1] - tp[0], tq[1], tq[1] - tq[0], max(room, 0), self.multi)


@BARRIERS.register("dssp", DSSPConfig)
class DSSP(Barrier):
    """Dynamic Stale Synchronous Parallel (Zhao et al., ICDCS 2019): a worker runs at most
    s_low steps ahead of the slowest, except that the fastest one may be granted r* ≤ r_max
    extra steps (`GrantController`), so that it next pushes when the slowest does.

    Decisions are taken at each push of p (`observe_push`, §5.2): use up a remaining grant
    (r[p] > 0), else proceed within s_low, else — for the fastest worker only — ask the
    controller for r* and proceed now if r* > 0; otherwise wait until the gap is ≤ s_low.

    Bound (A-DSSP-3, `bound_at_s_high`, default on): the effective threshold stays in
    [s_low, s_high], the range the paper says the controller chooses from. Its server
    procedure alone does not ensure it (a grant of r_max with the non-consuming OK runs
    r_max + 1 steps past s_low, and once a grant is used up the controller may grant again
    without limit), so the controller searches only the room left below s_high; `admit` also
    refuses any step past s_high as a safety net (`bound_holds` counts it, and stays 0).
    With the bound off, grants are up to r_max each and an OK'd step is admitted at any gap:
    the procedure as written.
    """

    def __init__(self, cfg: DSSPConfig, num_workers: int, seed: int = 0):
        super().__init__(cfg, num_workers, seed)
        self.s_low, self.s_high = cfg.s_low, cfg.s_high
        self.bounded = cfg.bound_at_s_high
        self.consumes_ok = cfg.grant_consumes_ok
        self.controller = GrantController(cfg, num_workers)
        self.remaining = [0] * num_workers  # r[i]: extra steps still granted to worker i
        # the step each worker was told it may start beyond s_low (−1: none); the grant holds
        # for that step only, so admission re-checks can't leak it into a later step
        self.ok_step = [-1] * num_workers
        self.grants = 0  # controller decisions with r* > 0
        self.bound_holds = 0  # pushes whose OK the s_high bound deferred

    def observe_push(self, worker: int, clocks: Sequence[int], now: float) -> None:
        self.controller.record(worker, now)
        gap = clocks[worker] - min(clocks)
        if self.remaining[worker] > 0:
            self.remaining[worker] -= 1
            self._ok(worker, clocks)
        elif gap <= self.s_low:
            pass  # admit's own s_low test lets it through
        elif clocks[worker] == max(clocks):
            extra = self._decide(worker, clocks, gap, now)
            if extra > 0:
                self.grants += 1
                self.remaining[worker] = extra - 1 if self.consumes_ok else extra
                self._ok(worker, clocks)
        # else: a worker that is not the fastest waits until the gap is ≤ s_low

    def admit(self, worker: int, clocks: Sequence[int], slowest: int) -> bool:
        gap = clocks[worker] - slowest
        if self.ok_step[worker] == clocks[worker]:
            return gap <= self.s_high or not self.bounded
        return gap <= self.s_low

    def _ok(self, worker: int, clocks: Sequence[int]) -> None:
        self.ok_step[worker] = clocks[worker]
        if self.bounded and clocks[worker] - min(clocks) > self.s_high:
            self.bound_holds += 1

    def _decide(self, p: int, clocks: Sequence[int], gap: int, now: float) -> int:
        extra, wait = self.controller.decide(p, clocks, gap)
        self.emit(
            "barrier",
            now,
            worker=p,
            event="dssp_grant",
            extra=extra,
            predicted_wait_s=wait,
            clock_gap=gap,
        )
        return extra
