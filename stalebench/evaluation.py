"""Evaluation off the critical path: the server only copies θ at a fixed cadence; the
snapshots are evaluated after training, and each result is reported at the wall time the
snapshot was taken, so evaluation never costs the run any of its clock."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from stalebench.config import EvalConfig

if TYPE_CHECKING:
    import torch
    from torch import nn

    from stalebench.data import Splits


@dataclasses.dataclass
class Snapshot:
    t: float
    version: int
    params: torch.Tensor


class Snapshots:
    """Takes a copy of θ at version 0, every `every_updates` updates or `every_s` seconds,
    and once more at the end."""

    def __init__(self, cfg: EvalConfig):
        self.cfg = cfg
        self.taken: list[Snapshot] = []
        self.next_version = 0
        self.next_t = 0.0

    def maybe(self, t: float, version: int, params: torch.Tensor) -> bool:
        """Take a snapshot if one is due; True when it did."""
        due_v = self.cfg.every_updates > 0 and version >= self.next_version
        due_t = self.cfg.every_s > 0 and t >= self.next_t
        if due_v or due_t or not self.taken:
            self.take(t, version, params)
            return True
        return False

    def take(self, t: float, version: int, params: torch.Tensor) -> None:
        if self.taken and self.taken[-1].version == version:
            return
        self.taken.append(Snapshot(t, version, params.detach().clone()))
        self.next_version = version + max(self.cfg.every_updates, 1)
        self.next_t = t + self.cfg.every_s


def objective(out: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """The training objective, chosen from the targets: least squares ½(f(x) − y)² for
    floating-point targets (regression), cross-entropy for integer labels; a sequence
    model's (B, T, classes) outputs count every position. `reduction`: mean or sum."""
    import torch

    if y.is_floating_point():
        squared = 0.5 * (out.reshape(y.shape) - y).square()
        return squared.mean() if reduction == "mean" else squared.sum()
    return torch.nn.functional.cross_entropy(
        out.reshape(y.numel(), -1), y.reshape(-1), reduction=reduction
    )


def evaluate(
    model: nn.Module, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, batch_size: int
) -> tuple[float, float | None]:
    """Mean `objective` and accuracy of `model` with flat parameters `params` on (x, y).
    A sequence model's (B, T, classes) outputs count every position: per-token loss and
    next-token accuracy. Regression (float targets) has no accuracy: None."""
    import torch
    from torch.nn.utils import vector_to_parameters

    vector_to_parameters(params, model.parameters())
    regression = y.is_floating_point()
    total_loss, correct, count = 0.0, 0, 0
    model.eval()
    with torch.no_grad():
        for start in range(0, len(y), batch_size):
            out = model(x[start : start + batch_size])
            target = y[start : start + batch_size]
            total_loss += objective(out, target, reduction="sum").item()
            if not regression:
                predicted = out.reshape(target.numel(), -1).argmax(1)
                correct += (predicted == target.reshape(-1)).sum().item()
            count += target.numel()
    model.train()
    return total_loss / count, None if regression else correct / count


def recalibrate_batch_norm(
    model: nn.Module, params: torch.Tensor, x: torch.Tensor, batch_size: int
) -> None:
    """Set BatchNorm running statistics for `params` from training data (the server never
    sees the workers' own statistics): reset them, then average over forward passes."""
    import torch
    from torch.nn.utils import vector_to_parameters

    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    vector_to_parameters(params, model.parameters())
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average over the passes below
    model.train()
    with torch.no_grad():
        for start in range(0, len(x), batch_size):
            model(x[start : start + batch_size])


def evaluate_snapshots(
    snapshots: list[Snapshot], model: nn.Module, splits: Splits, cfg: EvalConfig, seed: int, emit
) -> None:
    """Emit test (and a fixed training subset's) loss and accuracy of every snapshot
    (accuracy None for regression)."""
    import torch

    sets = [("test", splits.x_test, splits.y_test)]
    if cfg.train_samples:
        n = min(cfg.train_samples, len(splits.y_train))
        idx = torch.randperm(len(splits.y_train), generator=torch.Generator().manual_seed(seed))
        sets.append(("train", splits.x_train[idx[:n]], splits.y_train[idx[:n]]))
    # a language model (integer token targets per position): its perplexity too
    sequences = not splits.regression and splits.y_train.dim() > 1
    for snap in snapshots:
        if cfg.train_samples:
            recalibrate_batch_norm(model, snap.params, sets[1][1], cfg.batch_size)
        for split, x, y in sets:
            loss, acc = evaluate(model, snap.params, x, y, cfg.batch_size)
            extra = {"perplexity": math.exp(min(loss, 700.0))} if sequences else {}
            emit(
                "eval", snap.t, version=snap.version, split=split, loss=loss, accuracy=acc, **extra
            )
