"""engine=allreduce's replica, one program for both runtimes (the engine, its config and
checks: `stalebench.engines.allreduce`, which imports no torch)."""

from __future__ import annotations

from typing import Any

import torch

from stalebench.engines.common import GradientStep, Net, catch_up
from stalebench.engines.overlap import Rounds, build_replica, measure_step
from stalebench.engines.rounds import (
    close_round,
    lost_in_failure,
    replicas_left,
    ring_volume,
    round_slots,
    take_in_spares,
)
from stalebench.job import Job
from stalebench.models.nets import flatten_parameters
from stalebench.runtime.faults import Faults, WorkerDied
from stalebench.runtime.record import gradient
from stalebench.runtime.wire import Message
from stalebench.runtime.world import Op, World

# rank 0's word in a round's last slot: this round is not applied; a checkpoint after it
STOP, SAVE = 1.0, 2.0


def replica(job: Job, world: World) -> Op[dict[str, Any] | None]:
    """One replica's program: a round's statistics and gradient all-reduced (in one
    message, or with engine.bucket_mb in pieces as backward makes them: `Rounds`), then the
    mean gradient's step (P3: applied by layer in the next round's forward pass); rank 0
    reports the round and decides the stop, which the next round's message carries to every
    rank (that round is not applied). A spare (a rank after the N replicas) stands by until
    it takes a lost replica's place (`join`)."""
    n, rank, record, profile = job.num_workers, world.rank, world.record, job.profile
    device, eng = job.device(rank), job.cfg.engine
    model, params, rule, net, net_params = build_replica(job, device)
    x, y = job.splits.x_train[:1], job.splits.y_train[:1]
    yield from world.begin(lambda: gradient(net, net_params, (x, y), device))
    placed = yield from place(job, world, net, params, rule)
    if placed is None:  # a spare the run did not need
        return None
    params, rule, at = placed
    me, d, resumed, tail = at["workers"][rank], params.numel(), world.resumed, 3 * n + 1
    # the tail (statistics, rank 0's word), then the gradient (no values in a cost-only run)
    msg = Message(tail, round_slots(d, n) - tail, job.numerics)
    buf, grad = msg.buf, msg.payload
    step, faults = worker_of(job, world, net, params, me, at["version"], grad)
    if resumed is not None:  # its faults as they were
        world.faults = faults = resumed["faults"]
    p3, rounds = eng.schedule == "p3", None
    if eng.bucket_mb:
        nominal = (yield from measure_step(job, world, net, net_params)) if p3 else 1.0
        rounds = Rounds(job, world, step, params, rule, nominal, msg)
        step = rounds.step if rounds.pieces.hooked else step
    head = msg.head.numpy()  # the slots the protocol reads, as numpy: no tensor op a scalar
    stats, word = head[: 3 * n].reshape(n, 3), head[3 * n : tail]
    hooked = rounds is not None and rounds.pieces.hooked
    status, error, version = "completed", None, at["version"]
    t_last = world.now() if resumed is not None else 0.0
    quorum, live, bytes_sent = job.cfg.cluster.min_replicas, at["live"], at["bytes"]
    stop = save = False
    if record is not None and resumed is None:
        record.snapshots.maybe(0.0, 0, params)

    def close(round_stats, reduce_s: float, own: float, live: list[int]) -> None:
        nonlocal version, bytes_sent, status, stop, t_last  # the round is in θ
        version, bytes_sent = version + 1, bytes_sent + ring_volume(msg.size, len(live))
        if record is not None:  # rank 0 reports it and decides the stop
            t_last = world.now()
            bad, spent_ = close_round(record, t_last, version, round_stats, reduce_s, own,
                                      params, live)  # fmt: skip
            status, stop = "diverged" if bad else status, stop or bad or spent_

    try:
        while True:
            paused = world.strike()  # a pause stalls the round
            step_s = profile.step_s(me)  # the round's draw from the worker's stream
            closing = rounds.next_round(step_s) if rounds is not None else None
            if closing is not None and word[0] == STOP:  # P3: read from the round before
                break
            loss, compute = yield from world.compute(step, step_s)
            if closing is not None:  # P3: the forward pass applied the round before
                waited = rounds.pieces.waited - rounds.mark
                compute -= waited
                close(closing, waited, float(closing[0, 0]), live)
            head[:] = 0.0
            stats[me] = compute, loss, paused
            word[0] = STOP if stop else SAVE if save else 0.0  # rank 0's word (the others': 0)
            reduce_start = world.now()
            if rounds is not None:
                rounds.finish()  # the tail completes the first piece
            if p3 and hooked:  # on a virtual clock: one all-reduce, the forward's wait
                continue
            if hooked:  # the pieces went as backward made them
                yield from rounds.pieces.settle()
            else:
                lasts = rounds.pieces.comm_s(compute, faults.slow_s) if rounds else None
                if quorum:  # over the replicas left, once some are lost
                    before = live
                    ranks = yield from world.all_reduce_live(buf, lasts, nbytes=msg.nbytes)
                    live = [at["workers"][r] for r in ranks]
                    replicas_left(record, world.now(), version + 1, before, live, quorum, n)
                else:
                    # the network's ring time, or gloo's
                    yield from world.all_reduce(buf, lasts, nbytes=msg.nbytes)
            if word[0] == STOP:  # rank 0 decided last round that this one is not applied
                break
            if job.numerics:  # a cost-only run takes no update's arithmetic
                rule.step(params, grad.div_(len(live)), -1, 0)  # the mean over those left
            close(stats, world.now() - reduce_start, compute, live)
            if world.joining:  # spares take the lost replicas' places from the next round
                at["live"] = live
                live = yield from welcome(world, n, params, rule, version, stop, at)
            if word[0] == SAVE:  # every rank, at once
                at.update(version=version, live=live, bytes=bytes_sent)
                part = {"params": params, "rule": rule, "at": at, "faults": faults}
                yield from world.checkpoint(version, part, world.now(), live=bool(quorum))
            save = record is not None and not stop and world.checkpoint_due(world.now())
        if rounds is not None:
            rounds.pieces.close()  # inside: a peer lost at the last piece fails the run
    except WorkerDied:
        raise  # it is lost; the others lose it in the next all-reduce
    except Exception as exc:  # what is still under way is abandoned: waiting would raise again
        status, error, t_last = "failed", str(exc), world.now()
        if record is None:
            raise
        lost_in_failure(record, t_last, version + 1, live, exc, at["workers"])
    if record is None:
        return None
    world.release_spares()
    return record.finish(model, params, version, t_last, status, error, bytes_sent=bytes_sent)


def place(job: Job, world: World, net, params, rule) -> Op[tuple | None]:
    """Where this rank starts: a replica at round 0 (θ₀ and the rule as built); a resumed
    run's rank where its part of the checkpoint says; a spare, or a resumed run's rank that
    took no part, once it takes a lost replica's place (None: the run ended first). Returns
    (θ, rule, at): `at` the rounds so far, whether to stop, the replicas left, each rank's
    worker index, the bytes sent so far."""
    n, device = job.num_workers, job.device(world.rank)
    if world.resumed is not None:
        return join(device, net, world.resumed)
    if world.rank >= n or world.resumed_from >= 0:
        got = yield from world.stand_by()
        return None if got is None else join(device, net, got[1])
    workers = list(range(n)) + [-1] * (world.size - n)
    at = {"version": 0, "stop": False, "live": list(range(n)), "workers": workers, "bytes": 0}
    return params, rule, at


def worker_of(job: Job, world: World, net, params, me: int, version: int, out):
    """Worker `me`'s step (the gradient at θ into `out`, its loss the result; on the CPU
    the net's parameters are views of θ: no copy) and faults, from round `version` on (a
    spare: where the replica it replaces was, with the faults after it joined)."""
    device, profile, spare = job.device(world.rank), job.profile, world.rank >= job.num_workers
    batches = job.batches(me)
    catch_up(profile, me, batches, version)
    own = Net(job, device, net, params if device.type == "cpu" else None)
    step = GradientStep(own, params, own.buffers, batches, out, lambda grad, loss: loss)
    world.faults = Faults(profile, me, world.now() if spare else 0.0, version, spare)
    return step, world.faults


def welcome(world: World, n: int, params, rule, version: int, stop: bool, at: dict):
    """The replicas left hand θ and the update rule's state to the spares chosen (rank 0
    logs each `replaced`); returns the workers in the rounds from here."""
    live = take_in_spares(world, n, at["workers"], at["live"])
    at.update(version=version, stop=stop, live=live)
    yield from world.welcome({"params": params, "rule": rule, "at": at})
    return live


def join(device: torch.device, net, state: dict):
    """A spare chosen to take a lost replica's place, or a replica of a resumed run: θ and
    the update rule as the replicas left sent them, or its checkpoint saved them (its net's
    parameters views of that θ on the CPU)."""
    params, rule, at = state["params"], state["rule"], state["at"]
    if params.device.type == "cpu" and device.type == "cpu":
        sent = params.clone()
        flatten_parameters(net, params)  # the net's parameters views of θ (copied into it)
        params.copy_(sent)
    return params, rule, at
