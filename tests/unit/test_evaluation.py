"""stalebench.evaluation in process: when Snapshots takes θ (by updates, by time, the
boundaries, what `maybe` returns) and how recalibrate_batch_norm sets BatchNorm's running
statistics. Expected values are written by hand or computed with torch directly."""

from __future__ import annotations

import pytest
import torch

from stalebench.config import EvalConfig
from stalebench.data.base import Splits
from stalebench.evaluation import Snapshot, Snapshots, evaluate_snapshots, recalibrate_batch_norm

THETA = torch.zeros(3)


def offers(snapshots, points):
    """Offer θ at each (t, version); what maybe returned, and the snapshots taken."""
    returned = [snapshots.maybe(t, v, THETA) for t, v in points]
    return returned, [(s.t, s.version) for s in snapshots.taken]


def test_every_update_is_a_snapshot_with_every_updates_1():
    snapshots = Snapshots(EvalConfig(every_updates=1, every_s=0))
    returned, taken = offers(snapshots, [(0.0, 0), (0.1, 1), (0.2, 2), (0.3, 3)])
    assert returned == [True, True, True, True]
    assert taken == [(0.0, 0), (0.1, 1), (0.2, 2), (0.3, 3)]


def test_updates_cadence_returns_true_only_when_it_takes_one():
    snapshots = Snapshots(EvalConfig(every_updates=2, every_s=0))
    returned, taken = offers(snapshots, [(0.0, 0), (0.1, 1), (0.2, 2), (0.3, 3), (0.4, 4)])
    assert returned == [True, False, True, False, True]
    assert taken == [(0.0, 0), (0.2, 2), (0.4, 4)]


def test_a_snapshot_is_due_exactly_every_s_after_the_last_one():
    snapshots = Snapshots(EvalConfig(every_updates=0, every_s=0.5))
    points = [(0.0, 0), (0.25, 1), (0.5, 2), (0.75, 3), (1.0, 4)]  # binary-exact times
    returned, taken = offers(snapshots, points)
    assert returned == [True, False, True, False, True]
    assert taken == [(0.0, 0), (0.5, 2), (1.0, 4)]


def test_with_both_cadences_off_only_the_first_is_taken():
    snapshots = Snapshots(EvalConfig(every_updates=0, every_s=0))
    returned, taken = offers(snapshots, [(0.0, 0), (5.0, 10), (9.0, 20)])
    assert returned == [True, False, False]
    assert taken == [(0.0, 0)]


def _bn_model():
    return torch.nn.Sequential(torch.nn.BatchNorm1d(3))


X = torch.arange(24, dtype=torch.float32).reshape(8, 3) ** 1.5  # rows differ in spread


@pytest.mark.parametrize("batch_size", [4, 3])
def test_batch_norm_statistics_are_the_average_over_every_batch_of_the_data(batch_size):
    model = _bn_model()
    recalibrate_batch_norm(model, torch.tensor([1.0, 1, 1, 0, 0, 0]), X, batch_size)
    batches = [X[i : i + batch_size] for i in range(0, len(X), batch_size)]  # 8 rows: 4+4, 3+3+2
    mean = torch.stack([b.mean(0) for b in batches]).mean(0)  # momentum None: plain average
    var = torch.stack([b.var(0, unbiased=True) for b in batches]).mean(0)
    bn = model[0]
    torch.testing.assert_close(bn.running_mean, mean)
    torch.testing.assert_close(bn.running_var, var)
    assert bn.num_batches_tracked.item() == len(batches)


def test_batch_norm_is_recalibrated_with_the_given_parameters():
    model = _bn_model()
    params = torch.tensor([2.0, 3.0, 4.0, -1.0, 0.0, 1.0])  # weight, then bias
    recalibrate_batch_norm(model, params, X, 4)
    assert model[0].weight.tolist() == [2.0, 3.0, 4.0]
    assert model[0].bias.tolist() == [-1.0, 0.0, 1.0]


def test_a_model_without_batch_norm_is_left_untouched():
    model = torch.nn.Linear(3, 2)
    before = [p.clone() for p in model.parameters()]
    recalibrate_batch_norm(model, torch.zeros(8), X, 4)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_the_training_split_is_evaluated_on_train_samples_of_its_rows():
    # θ = 0 on a linear regression: each row's loss is ½y², so the train loss tells which
    # rows were used: two of the five (some pair's mean), never all five (mean 5.5)
    y_train = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    splits = Splits(torch.zeros(5, 1), y_train, torch.zeros(2, 1), torch.tensor([2.0, 4.0]))
    events = []
    evaluate_snapshots(
        [Snapshot(0.5, 3, torch.zeros(1))],
        torch.nn.Linear(1, 1, bias=False),
        splits,
        EvalConfig(train_samples=2, batch_size=4),
        0,
        lambda kind, t, **fields: events.append((kind, t, fields)),
    )
    assert [(k, t, f["version"], f["split"]) for k, t, f in events] == [
        ("eval", 0.5, 3, "test"),
        ("eval", 0.5, 3, "train"),
    ]
    assert events[0][2]["loss"] == pytest.approx((2 + 8) / 2)  # ½·4 and ½·16
    pairs = {(a * a + b * b) / 4 for a in range(1, 6) for b in range(a + 1, 6)}
    assert min(abs(events[1][2]["loss"] - p) for p in pairs) < 1e-6


def _train_loss(seed, train_samples=5):
    # θ = 0 on a linear regression of 20 rows with distinct targets 1..20: ½·mean(y²) of the
    # rows evaluated identifies them
    y = torch.arange(1.0, 21.0)
    splits = Splits(torch.zeros(20, 1), y, torch.zeros(1, 1), torch.ones(1))
    events = []
    evaluate_snapshots(
        [Snapshot(0.0, 0, torch.zeros(1))],
        torch.nn.Linear(1, 1, bias=False),
        splits,
        EvalConfig(train_samples=train_samples, batch_size=8),
        seed,
        lambda kind, t, **fields: events.append(fields),
    )
    return events[1]["loss"]


def test_the_training_subset_is_the_runs_seeded_draw_whatever_the_global_generator():
    # the subset is a permutation drawn from a generator seeded by the run's seed, so it does
    # not depend on what else used torch's global generator before
    rows = torch.randperm(20, generator=torch.Generator().manual_seed(7))[:5]
    expected = 0.5 * (rows.float() + 1).square().mean().item()
    for global_seed in (0, 1):
        torch.manual_seed(global_seed)
        assert _train_loss(7) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("model", "x", "y", "perplexity"),
    [  # θ = 0 throughout
        (torch.nn.Linear(1, 2, bias=False), torch.zeros(2, 1), torch.tensor([0, 1]), False),
        (torch.nn.Linear(1, 1, bias=False), torch.zeros(2, 1), torch.tensor([0.5, 1.0]), False),
        (torch.nn.Embedding(2, 2), torch.tensor([[0, 1]]), torch.tensor([[1, 0]]), True),
    ],
    ids=["labels", "regression", "tokens"],
)
def test_perplexity_is_reported_for_token_sequences_only(model, x, y, perplexity):
    n = sum(p.numel() for p in model.parameters())
    events = []
    evaluate_snapshots(
        [Snapshot(0.0, 0, torch.zeros(n))],
        model,
        Splits(x, y, x, y),
        EvalConfig(train_samples=0),
        0,
        lambda kind, t, **fields: events.append(fields),
    )
    (test,) = events
    assert ("perplexity" in test) == perplexity
    if perplexity:  # uniform over 2 tokens: loss ln 2, perplexity 2
        assert test["perplexity"] == pytest.approx(2.0)
