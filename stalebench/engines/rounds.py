"""A synchronous round's bookkeeping, shared by engine=allreduce's one-message round and
its rounds in pieces: the slots and bytes of a round's message, its ring volume, and the
events rank 0 writes for it."""

from __future__ import annotations

import torch

from stalebench.metrics.events import EventLog
from stalebench.runtime.record import RunRecord, diverged, spent


def round_slots(num_params: int, num_workers: int) -> int:
    """Float32 slots one round all-reduces: the gradient, then 3 per rank (compute time,
    loss, seconds paused by a fault) and a stop flag."""
    return num_params + 3 * num_workers + 1


def round_bytes(num_params: int, num_workers: int) -> int:
    """Size of the message one round all-reduces (the tail counts: it travels with it)."""
    return 4 * round_slots(num_params, num_workers)


def report_round(
    log: EventLog,
    t: float,
    version: int,
    stats: torch.Tensor,
    reduce_s: float,
    own_s: float,
    live: list[int] | None = None,
) -> None:
    """Rank 0's events for the round that made `version`: each rank's pause, if a fault
    paused it, and its update. `stats` holds (compute_s, loss, paused_s) per rank; of rank
    0's all-reduce time `reduce_s`, slowest − `own_s` (its own compute) was waiting, the rest
    is the round's communication. `live`: the ranks in the round (default: all)."""
    workers = sorted(live) if live is not None else list(range(len(stats)))
    rows = stats.tolist()
    slowest = max(rows[w][0] for w in workers)
    for w in workers:
        if rows[w][2] > 0:
            log.emit("worker", t, worker=w, event="pause", duration_s=rows[w][2])
    comm_s = max(reduce_s - (slowest - own_s), 0.0)
    updates = [
        {"worker": w, "clock": version - 1, "version": version, "lag": 0, "loss": rows[w][1],
         "compute_s": rows[w][0], "wait_s": slowest - rows[w][0], "comm_s": comm_s,
         "clock_gap": 0}
        for w in workers
    ]  # fmt: skip
    log.emit_all("update", t, updates)


def ring_volume(nbytes: int, num_workers: int) -> int:
    """Bytes all ranks together send in one ring all-reduce of `nbytes`: 2(N − 1)·nbytes."""
    return 2 * (num_workers - 1) * nbytes


def close_round(
    record: RunRecord,
    t: float,
    version: int,
    stats: torch.Tensor,
    reduce_s: float,
    own_s: float,
    params: torch.Tensor,
    live: list[int] | None = None,
) -> tuple[bool, bool]:
    """Rank 0, once the round that made `version` is in θ: its events (`report_round`), a
    snapshot of θ when one is due; (diverged, the budget spent). θ is checked for
    non-finite values only when it is snapshotted, the summed loss every round. `live`:
    the ranks in the round (default: all). A cost-only run's has no loss and no θ to check,
    and takes no snapshot."""
    report_round(record.events, t, version, stats, reduce_s, own_s, live)
    if not record.job.numerics:
        return False, spent(record.job.cfg.budget, version, t)
    snapped = record.snapshots.maybe(t, version, params)
    if diverged(float(stats[:, 1].sum()), params if snapped else None):
        return True, True
    return False, spent(record.job.cfg.budget, version, t)
