"""What both runtimes of the gossip engine share: a node (its numerator x, weight w, local
optimizer, minibatches, BatchNorm statistics), when the nodes meet, their statistics, and
the events rank 0 writes from them (the role, a node's rank, and its protocol: `peer`).

One iteration k (0-based) of node i, in both runtimes:

1. z = x / w (x for D-PSGD), the gradient of its next minibatch at z;
2. SGP: the local step on the numerator x (fairscale, and the SGP repository, apply the
   optimizer to the PushSum numerator: the gradient is taken at z, the step changes x);
3. the gossip: keep the own share of (x, w), send the same share to each out-peer of
   iteration k, add the messages its in-peers sent at iteration k − τ;
4. D-PSGD: the local step after the mixing (x_i ← Σ_j W_ij x_j − γ∇f(x_i)).

Every `engine.sync_every` iterations (and at budget.max_updates) the nodes meet: z̄, the
mean of the z_i, is what is snapshotted and evaluated; each node's ‖z_i − z̄‖ goes into its
`update` event as `consensus`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from stalebench import precision
from stalebench.algorithms.gossip import GOSSIP, Mixing
from stalebench.algorithms.local import INNER
from stalebench.engines.common import GradientStep, Net
from stalebench.job import Job

# a row of statistics per node per iteration: when it ended, the minibatch's loss, the
# compute, the seconds it waited for messages (and the last collective), the seconds the
# network's profile took (sends, receives, the last collective), a fault's pause, the lag
# (τ when it took messages in, else 0)
ROW = ("t", "loss", "compute_s", "wait_s", "comm_s", "paused_s", "lag")


def mixing(job: Job) -> Mixing:
    return GOSSIP.build(job.cfg.algorithm.gossip, job.num_workers)


class Node:
    """One node: its PushSum numerator x and weight w, local optimizer, minibatches and
    BatchNorm statistics."""

    def __init__(self, job: Job, index: int, theta: torch.Tensor, net: Net, rule: Mixing):
        self.index, self.rule = index, rule
        self.x, self.w = theta.clone(), torch.ones(1, device=theta.device)
        self.inner = INNER.build(job.cfg.algorithm.inner, self.x)
        self.batches = job.batches(index)
        self.buffers = [b.detach().clone() for b in net.buffers]
        self.scale = precision.loss_scale(net.device)  # fp16: its own loss scale

    @property
    def z(self) -> torch.Tensor:
        if self.x.is_meta:  # a cost-only run's: nothing to divide, no gradient computed
            return self.x
        return self.rule.debias(self.x, self.w)

    def gradient(self, net: Net) -> GradientStep:
        """The gradient at z of the next minibatch, with the node's BatchNorm statistics, as
        a step (`World.compute`): its result (gradient, loss)."""
        return GradientStep(net, self.z, self.buffers, self.batches, None, _both, self.scale)

    def step(self, grad: torch.Tensor) -> None:
        self.inner.step(grad)

    def send(self, k: int) -> torch.Tensor:
        """Keep the own share; the message [x | w] for each out-peer of iteration k."""
        return self.rule.send(self.x, self.w, self.index, k)

    def receive(self, message: torch.Tensor) -> None:
        """Take in a message [x | w] (from host memory: copied to x's device at once, the
        buffer then free for the next one)."""
        self.rule.receive(self.x, self.w, message.to(self.x.device))


def message_bytes(num_params: int) -> int:
    return 4 * (num_params + 1)


def syncs_at(k: int, sync_every: int, max_updates: int) -> bool:
    """Do the nodes meet after iteration k (0-based)? Every `sync_every` iterations, and at
    the iteration budget (every rank stops there)."""
    done = k + 1
    return done % sync_every == 0 or done == max_updates


def stats_slots(num_nodes: int, sync_every: int) -> int:
    """Float64 slots of the statistics' all-reduce: a window of rows per node, ‖z_i − z̄‖
    per node, the stop and divergence flags."""
    return num_nodes * sync_every * len(ROW) + num_nodes + 2


def gossip_bytes(
    rule: Mixing, first: int, last: int, num_params: int, lost: set[int] = frozenset()
) -> int:  # fmt: skip
    """Bytes every node together sends in iterations first … last − 1 of the gossip (the
    nodes `lost` neither send nor are sent to)."""
    nodes = [i for i in range(rule.num_nodes) if i not in lost]
    sends = sum(
        sum(p not in lost for p in rule.out_peers(i, k)) for k in range(first, last) for i in nodes
    )
    return sends * message_bytes(num_params)


def report(
    emit, first: int, rows: np.ndarray, dists: np.ndarray, nodes: list[int] | None = None
) -> None:  # fmt: skip
    """The `update` events (and fault pauses) of iterations first, first + 1, … of every
    node, in time order; `rows[i, j]` is node i's row (ROW) of iteration first + j, `dists`
    each node's ‖z_i − z̄‖ after the window's last iteration (its `consensus`). `nodes`:
    the node each row is (default: row i is node i; the nodes left, once some are lost)."""
    nodes = nodes if nodes is not None else list(range(len(rows)))
    num_nodes, iterations, _ = rows.shape
    ends = rows[:, :, 0]
    # clock_gap: how many iterations the node was ahead of the slowest one when it ended
    done = np.stack(
        [first + np.searchsorted(ends[i], ends, side="right") for i in range(num_nodes)]
    )
    gaps = np.arange(first + 1, first + iterations + 1)[None, :] - done.min(axis=0)
    order = sorted((float(ends[i, j]), j, i) for i in range(num_nodes) for j in range(iterations))
    for t, j, i in order:
        t_row, loss, compute, wait, comm, paused, lag = rows[i, j].tolist()
        if paused > 0:
            emit("worker", t, worker=nodes[i], event="pause", duration_s=paused)
        fields: dict[str, Any] = dict(
            worker=nodes[i], clock=first + j, version=first + j + 1, lag=int(lag), loss=loss,
            compute_s=compute, wait_s=wait, comm_s=comm, clock_gap=max(int(gaps[i, j]), 0),
        )  # fmt: skip
        if j == iterations - 1:
            fields["consensus"] = float(dists[i])
        emit("update", t, **fields)


def _both(grad: torch.Tensor, loss: float) -> tuple[torch.Tensor, float]:
    return grad, loss
