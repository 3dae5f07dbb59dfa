"""Divergence as papers mean it: a run whose held-out loss ends above
budget.diverge_factor × its initial loss, or overflows, is `diverged` (it used to end
`completed` with a loss of 1e17); `fails` claims read summary.json's chance accuracy."""

import json
import math

import pytest
import torch

from stalebench.config import BudgetConfig
from stalebench.errors import ConfigError
from stalebench.runtime.record import blown_up, chance_accuracy
from tests.conftest import compose

LSQ = [
    "runtime=sim", "model=linear", "dataset=regression", "dataset.conditioning=100",
    "dataset.num_features=50", "algorithm=asp", "cluster=homogeneous", "cluster.num_workers=2",
    "budget.max_wall_s=0", "budget.max_updates=200", "eval.every_updates=50",
    "eval.train_samples=0", "logger=none",
]  # fmt: skip


def run(tmp_path, *overrides):
    from stalebench import experiment

    cfg = compose([*LSQ, *overrides])
    cfg.run_dir = str(tmp_path)
    return experiment.run(cfg)


def test_least_squares_at_too_large_a_step_ends_diverged_not_completed(tmp_path):
    # lr 1.2 on this problem: the loss grows from 0.5 to ~1e17 and stays finite
    s = run(tmp_path / "big", "algorithm.update.lr=1.2")
    assert s["status"] == "diverged"
    assert math.isfinite(s["final"]["loss"]) and s["final"]["loss"] > 1e6
    assert "budget.diverge_factor=10" in s["error"]
    events = [json.loads(x) for x in (tmp_path / "big" / "events.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "end" and events[-1]["status"] == "diverged"
    # the same run with the check off ends completed, as it did before
    off = run(tmp_path / "off", "algorithm.update.lr=1.2", "budget.diverge_factor=0")
    assert off["status"] == "completed"
    assert run(tmp_path / "ok", "algorithm.update.lr=0.5")["status"] == "completed"


def test_blown_up_reads_overflow_and_the_factor():
    assert blown_up([0.5, 0.4, None], 10) == "the held-out loss ends at None (overflow)"
    assert "overflow" in blown_up([0.5, math.inf], 0)
    assert blown_up([0.5, 5.0], 10) is None  # exactly 10×: not above
    assert "above budget.diverge_factor=10" in blown_up([0.5, 5.01], 10)
    assert blown_up([0.5, 500.0], 0) is None  # off: only non-finite
    assert blown_up([], 10) is None


@pytest.mark.parametrize("factor", [1.0, 0.5, -2.0])
def test_a_diverge_factor_must_be_off_or_above_one(factor):
    with pytest.raises(ConfigError, match=f"budget.diverge_factor must be 0 .* got {factor}"):
        BudgetConfig(diverge_factor=factor)


def test_chance_accuracy_is_the_majority_class_rate_of_the_held_out_split():
    from stalebench.data.base import Splits

    y = torch.tensor([0, 1, 1, 2, 1, 0, 1, 1])
    x = torch.zeros(8, 3)
    splits = Splits(x, y, x, y)
    assert chance_accuracy(splits) == 5 / 8
    held = splits.hold_out(0.5)
    assert chance_accuracy(held) == float(torch.bincount(held.y_val).max()) / len(held.y_val)
    reg = Splits(x, y.float(), x, y.float())
    assert chance_accuracy(reg) is None
