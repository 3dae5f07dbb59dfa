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


def test_the_simulators_grid_holds_theta_as_of_each_grid_time():
    # every_s = 0.5: grid times 0, 0.5, 1.0. Updates at 0.3 (v1, then v2 at the same time)
    # and at 1.1 (v3); the run ends at 1.2. θ as of 0.5 and 1.0 is v2 (the last at or before
    # them), not v1 (the first offer past 0.5 in time order) nor v3 (the first past 1.0)
    snapshots = Snapshots(EvalConfig(every_updates=0, every_s=0.5), on_grid=True)
    theta = torch.zeros(2)
    offers = [(0.0, 0, 0.0), (0.3, 1, 1.0), (0.3, 2, 2.0), (1.1, 3, 3.0)]
    returned = []
    for t, v, value in offers:
        theta.fill_(value)  # the engine's θ, changed in place
        returned.append(snapshots.maybe(t, v, theta))
    theta.fill_(3.0)
    snapshots.take(1.2, 3, theta)
    taken = [(s.t, s.version, s.params.tolist()) for s in snapshots.taken]
    assert taken == [
        (0.0, 0, [0.0, 0.0]),
        (0.5, 2, [2.0, 2.0]),
        (1.0, 2, [2.0, 2.0]),
        (1.2, 3, [3.0, 3.0]),
    ]
    assert returned == [False, True, False, True]  # grid times emitted at that offer
    assert snapshots.taken[1].params is snapshots.taken[2].params  # one copy of one θ
    assert all(s.params is not theta for s in snapshots.taken)


def test_a_run_ending_on_a_grid_time_ends_with_that_grid_time():
    snapshots = Snapshots(EvalConfig(every_updates=0, every_s=0.5), on_grid=True)
    for t, v in [(0.0, 0), (0.2, 1), (0.7, 2)]:
        snapshots.maybe(t, v, torch.full((1,), float(v)))
    snapshots.take(1.0, 2, torch.full((1,), 2.0))
    assert [(s.t, s.version) for s in snapshots.taken] == [(0.0, 0), (0.5, 1), (1.0, 2)]


def test_grid_times_before_the_first_offer_are_not_invented():
    snapshots = Snapshots(EvalConfig(every_updates=0, every_s=0.5), on_grid=True)
    snapshots.maybe(0.8, 4, torch.ones(1))
    snapshots.maybe(1.3, 5, torch.ones(1))
    assert [(s.t, s.version) for s in snapshots.taken] == [(1.0, 4)]


def test_on_the_grid_every_updates_adds_the_updates_own_times():
    snapshots = Snapshots(EvalConfig(every_updates=2, every_s=1.0), on_grid=True)
    for t, v in [(0.0, 0), (0.4, 1), (0.8, 2), (1.2, 3), (1.6, 4)]:
        snapshots.maybe(t, v, torch.full((1,), float(v)))
    snapshots.take(1.7, 4, torch.full((1,), 4.0))
    taken = [(s.t, s.version, s.params.item()) for s in snapshots.taken]
    # (0, 0) is both the first version copy and grid time 0: taken once
    assert taken == [(0.0, 0, 0.0), (0.8, 2, 2.0), (1.0, 2, 2.0), (1.6, 4, 4.0), (1.7, 4, 4.0)]


def test_an_update_logged_at_a_grid_time_is_in_that_grid_times_theta():
    # 0.1 + 0.2 = 0.30000000000000004: events.jsonl writes 0.3, so θ at grid time 0.3 has it
    snapshots = Snapshots(EvalConfig(every_updates=0, every_s=0.3), on_grid=True)
    snapshots.maybe(0.0, 0, torch.zeros(1))
    snapshots.maybe(0.1 + 0.2, 1, torch.ones(1))
    snapshots.maybe(0.4, 2, torch.ones(1))
    assert [(s.t, s.version) for s in snapshots.taken] == [(0.0, 0), (0.3, 1)]


class Counting(torch.nn.Linear):
    """A linear model that counts its forward passes."""

    calls = 0

    def forward(self, x):
        Counting.calls += 1
        return super().forward(x)


def test_grid_times_sharing_one_theta_are_evaluated_once():
    shared, other = torch.zeros(1), torch.ones(1)
    snaps = [Snapshot(0.0, 0, shared), Snapshot(0.5, 0, shared), Snapshot(1.0, 1, other)]
    splits = Splits(torch.ones(4, 1), torch.ones(4), torch.ones(2, 1), torch.ones(2))
    events = []
    Counting.calls = 0
    evaluate_snapshots(
        snaps, Counting(1, 1, bias=False), splits, EvalConfig(train_samples=0, batch_size=8), 0,
        lambda kind, t, **fields: events.append((t, fields["version"], fields["loss"])),
    )  # fmt: skip
    assert Counting.calls == 2  # two copies of θ, one batch each
    # θ = 0: ½·(0 − 1)² = 0.5; θ = 1: 0
    assert events == [(0.0, 0, 0.5), (0.5, 0, 0.5), (1.0, 1, 0.0)]


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


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no GPU here"))]  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
def test_snapshots_are_evaluated_on_the_runs_device_with_the_same_results(device):
    # a CPU model, CPU snapshots and data: evaluated on `device` (a copy of the model moved
    # there, each minibatch moved as it is read), the model left where it was
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    n = sum(p.numel() for p in model.parameters())
    snaps = [Snapshot(0.0, 0, torch.randn(n)), Snapshot(1.0, 1, torch.randn(n))]
    x, y = torch.randn(50, 5), torch.randint(0, 3, (50,))
    splits = Splits(x, y, x[:20], y[:20])
    cfg = EvalConfig(train_samples=10, batch_size=7)

    def run(on):
        out = []

        def emit(kind, t, **f):
            out.append((t, f["split"], f["loss"], f["accuracy"]))

        evaluate_snapshots(snaps, model, splits, cfg, 0, emit, on)
        return out

    here, there = run(None), run(torch.device(device))
    assert [r[:2] for r in there] == [r[:2] for r in here] and len(here) == 4
    for (_, _, loss, acc), (_, _, loss_d, acc_d) in zip(here, there, strict=True):
        assert loss_d == pytest.approx(loss, rel=1e-5) and acc_d == acc
    assert next(model.parameters()).device.type == "cpu"
    # by hand, θ of the last snapshot on the test split
    torch.nn.utils.vector_to_parameters(snaps[1].params, model.parameters())
    with torch.no_grad():
        out = model(x[:20])
    loss = torch.nn.functional.cross_entropy(out, y[:20]).item()
    acc = (out.argmax(1) == y[:20]).float().mean().item()
    test = [r for r in there if r[0] == 1.0 and r[1] == "test"][0]
    assert test[2] == pytest.approx(loss, rel=1e-5) and test[3] == pytest.approx(acc)
