"""The validation split a tuning run is selected on (eval.split=val): a fixed carve of the
training split, disjoint from what every worker trains on, evaluated instead of the test
split, and read back by summary.json."""

from __future__ import annotations

import pytest
import torch

from stalebench.config import EvalConfig
from stalebench.data import shard_batches
from stalebench.data.base import Splits
from stalebench.errors import ConfigError
from stalebench.evaluation import Snapshot, evaluate_snapshots
from stalebench.job import Job
from stalebench.metrics.summary import summarize
from tests.conftest import compose


def splits(n: int = 100, n_test: int = 30) -> Splits:
    """Rows that name themselves: x[i] = (i, i), labels i mod 3; test rows negative."""
    x = torch.arange(n, dtype=torch.float32).repeat(2, 1).T.contiguous()
    xt = -1 - torch.arange(n_test, dtype=torch.float32).repeat(2, 1).T.contiguous()
    return Splits(x, torch.arange(n) % 3, xt, torch.arange(n_test) % 3)


def rows(x: torch.Tensor) -> set[int]:
    return {int(v) for v in x[:, 0].tolist()}


def test_the_carve_holds_out_the_fraction_disjoint_from_the_rest():
    whole = splits()
    held = whole.hold_out(0.2)
    assert (len(held.y_train), len(held.y_val)) == (80, 20)
    assert rows(held.x_train).isdisjoint(rows(held.x_val))
    assert rows(held.x_train) | rows(held.x_val) == set(range(100))
    # what is left keeps its order; labels follow their rows
    assert held.x_train[:, 0].tolist() == sorted(held.x_train[:, 0].tolist())
    assert torch.equal(held.y_val, held.x_val[:, 0].long() % 3)
    # the test split is kept as it was (never evaluated: see below)
    assert torch.equal(held.x_test, whole.x_test) and held.num_classes == whole.num_classes


def test_the_carve_is_fixed_whatever_the_run():
    a, b = splits().hold_out(0.1), splits().hold_out(0.1)
    assert torch.equal(a.x_val, b.x_val) and torch.equal(a.x_train, b.x_train)
    other = splits().hold_out(0.1, seed=1)
    assert not torch.equal(a.x_val, other.x_val)


@pytest.mark.parametrize("fraction", [0.001, 0.999])
def test_a_carve_that_leaves_nothing_on_one_side_is_refused(fraction):
    with pytest.raises(ConfigError, match=r"eval\.validation_fraction"):
        splits(n=10).hold_out(fraction)


@pytest.mark.parametrize(
    "fields, key",
    [
        ({"split": "train"}, "eval.split"),
        ({"validation_fraction": 0.0}, "eval.validation_fraction"),
        ({"validation_fraction": 0.51}, "eval.validation_fraction"),
    ],
)
def test_bad_eval_split_settings_are_refused_by_key(fields, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        EvalConfig(**fields)


def test_workers_shard_only_what_the_validation_split_left():
    cfg = compose(
        ["dataset=synthetic", "cluster.num_workers=3", "eval.split=val"]
        + ["eval.validation_fraction=0.25", "dataset.sharding=disjoint"]
    )
    job = Job.build(cfg)
    whole = compose(["dataset=synthetic", "cluster.num_workers=3"])
    n = len(Job.build(whole).splits.y_train)
    assert (len(job.splits.y_train), len(job.splits.y_val)) == (n - n // 4, n // 4)
    val = {tuple(r) for r in job.splits.x_val.tolist()}
    trained: set[tuple] = set()
    for w in range(3):
        batches = shard_batches(job.splits, w, 3, 32, cfg.seed, job.sharding)
        trained |= {tuple(r) for r in job.splits.x_train[batches.shard].tolist()}
    assert len(trained) == n - n // 4  # every remaining example, and only those
    assert trained.isdisjoint(val)


def test_the_validation_split_is_evaluated_instead_of_the_test_split():
    held = splits().hold_out(0.2)
    model = torch.nn.Linear(2, 3)
    params = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    emitted = []
    evaluate_snapshots(
        [Snapshot(0.0, 0, params), Snapshot(1.0, 5, params)],
        model,
        held,
        EvalConfig(train_samples=10),
        seed=0,
        emit=lambda kind, t, **f: emitted.append((kind, t, f)),
    )
    assert [f["split"] for _, _, f in emitted] == ["val", "train", "val", "train"]
    # the summary's headline numbers then read the validation split
    events = [{"kind": k, "t": t, **f} for k, t, f in emitted]
    meta = {"num_workers": 1}
    summary = summarize(events, meta, "completed", None, target_accuracy=0.0)
    last_val = [f for _, _, f in emitted if f["split"] == "val"][-1]
    assert summary["eval_split"] == "val"
    assert summary["final"]["loss"] == last_val["loss"]
    assert summary["time_to_target_s"] == 0.0
    plain = summarize(
        [{**e, "split": "test"} if e["split"] == "val" else e for e in events],
        meta,
        "completed",
        None,
        0.0,
    )
    assert plain["eval_split"] == "test"
