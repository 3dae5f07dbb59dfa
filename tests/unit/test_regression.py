"""The convex problem: seeded linear regression data, the least-squares objective chosen from
float targets (gradient = the closed form), evaluation without accuracy, and an end-to-end
simulated run whose test loss falls to the noise floor."""

from __future__ import annotations

from itertools import islice

import numpy as np
import pytest
import torch

from stalebench.data import DATASETS, shard_batches
from stalebench.data.regression import Regression, RegressionConfig, linear_problem
from stalebench.errors import ConfigError
from stalebench.evaluation import evaluate, objective
from stalebench.models import MODELS, LinearConfig
from stalebench.runtime.record import gradient
from tests.conftest import run_job


def regression(**kw) -> Regression:
    cfg = dict(num_train=80, num_test=30, num_features=6)
    cfg.update(kw)
    return Regression(RegressionConfig(name="regression", **cfg))


# --------------------------------------------------------------------------- data


def test_regression_shapes_and_dtypes():
    s = regression().load()
    assert s.x_train.shape == (80, 6) and s.y_train.shape == (80,)
    assert s.x_test.shape == (30, 6) and s.y_test.shape == (30,)
    for t in (s.x_train, s.y_train, s.x_test, s.y_test):
        assert t.dtype == torch.float32
    assert s.regression and s.input_shape == (6,)
    assert s.num_classes == 1  # one output


def test_targets_are_the_linear_model_plus_noise():
    d = regression(noise=0.0)
    s, w = d.load(), torch.as_tensor(d.true_weights())
    torch.testing.assert_close(s.y_train, s.x_train @ w, rtol=1e-5, atol=1e-5)
    noisy = regression(noise=0.5)
    residual = noisy.load().y_train - noisy.load().x_train @ torch.as_tensor(noisy.true_weights())
    assert 0.3 < residual.std().item() < 0.7


def test_same_data_seed_is_identical_and_another_differs():
    a, b, c = regression(data_seed=3).load(), regression(data_seed=3).load(), regression().load()
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert not torch.equal(a.x_train, c.x_train)


@pytest.mark.parametrize("sparsity, nonzero", [(1.0, 10), (0.3, 3), (0.5, 5), (0.01, 1)])
def test_sparsity_is_the_fraction_of_nonzero_weights(sparsity, nonzero):
    _, _, w = linear_problem(5, 10, 0.1, sparsity, seed=0)
    assert np.count_nonzero(w) == nonzero


def test_weights_are_scaled_to_unit_signal_variance():
    x, y, w = linear_problem(20_000, 50, 0.0, 0.2, seed=1)
    assert 0.3 < float(np.sum(w**2)) < 3.0
    assert 0.3 < float(y.var()) < 3.0


@pytest.mark.parametrize(
    "key, value",
    [("noise", -0.1), ("sparsity", 0.0), ("sparsity", 1.5), ("num_features", 0), ("num_test", 0)],
)
def test_regression_rejects_bad_config(key, value):
    with pytest.raises(ConfigError, match=rf"dataset\.{key} .*got {value}"):
        RegressionConfig(name="regression", **{key: value})


def test_regression_is_registered():
    assert DATASETS.get("regression")[1] is RegressionConfig


def test_batches_keep_float_targets():
    s = regression().load()
    for x, y in islice(shard_batches(s, 1, 2, 8, seed=0), 6):
        assert x.shape == (8, 6) and y.shape == (8,) and y.dtype == torch.float32


# --------------------------------------------------------------------------- objective


def linear_model(num_features: int = 6) -> torch.nn.Module:
    torch.manual_seed(0)
    return MODELS.build(LinearConfig(name="linear"), (num_features,), 1)


def test_linear_model_is_one_layer_to_one_output():
    model = linear_model()
    assert sorted(tuple(p.shape) for p in model.parameters()) == [(1,), (1, 6)]
    assert list(model.named_buffers()) == []


def test_least_squares_gradient_is_the_closed_form():
    s = regression().load()
    x, y = s.x_train[:16], s.y_train[:16]
    model = linear_model()
    params = list(model.parameters())
    grad, loss = gradient(model, params, (x, y), torch.device("cpu"))

    weight, bias = (p.detach().double() for p in params)
    xd, yd = x.double(), y.double()
    residual = xd @ weight[0] + bias - yd
    n = len(y)
    assert loss == pytest.approx(0.5 * float((residual**2).mean()), rel=1e-5)
    expected = torch.cat([xd.T @ residual / n, residual.mean().reshape(1)])  # ∇w, ∇b
    torch.testing.assert_close(grad.double(), expected, rtol=1e-5, atol=1e-6)


def test_objective_picks_the_loss_from_the_targets():
    out = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    labels = torch.tensor([0, 1])
    ce = torch.nn.functional.cross_entropy(out, labels)
    assert torch.equal(objective(out, labels), ce)
    assert objective(out, labels, "sum").item() == pytest.approx(2 * ce.item())
    pred, target = torch.tensor([[1.0], [3.0]]), torch.tensor([0.0, 1.0])
    assert objective(pred, target).item() == pytest.approx(0.5 * (1 + 4) / 2)
    assert objective(pred, target, "sum").item() == pytest.approx(0.5 * (1 + 4))


def test_evaluate_regression_has_loss_and_no_accuracy():
    s = regression().load()
    model = linear_model()
    params = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    loss, accuracy = evaluate(model, params, s.x_test, s.y_test, batch_size=7)
    assert accuracy is None
    with torch.no_grad():
        expected = 0.5 * ((model(s.x_test)[:, 0] - s.y_test) ** 2).mean().item()
    assert loss == pytest.approx(expected, rel=1e-5)


def test_evaluate_classification_is_unchanged():
    torch.manual_seed(0)
    x, y = torch.randn(20, 5), torch.arange(20) % 3
    model = MODELS.build(LinearConfig(name="linear"), (5,), 3)
    params = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    loss, accuracy = evaluate(model, params, x, y, batch_size=6)
    with torch.no_grad():
        out = model(x)
    assert loss == pytest.approx(torch.nn.functional.cross_entropy(out, y).item(), rel=1e-5)
    assert accuracy == pytest.approx((out.argmax(1) == y).float().mean().item())


# --------------------------------------------------------------------------- end to end


def sim_run(run_dir, *overrides: str) -> tuple[dict, list[dict]]:
    result = run_job(
        run_dir,
        [
            "runtime=sim",
            "dataset=regression",
            "model=linear",
            "dataset.num_train=400",
            "dataset.num_test=200",
            "budget.max_updates=60",
            "eval.every_updates=20",
            *overrides,
        ],
    )
    return result.summary, result.events


def test_sim_run_on_least_squares_converges_deterministically(tmp_path):
    summary, events = sim_run(tmp_path / "a")
    assert summary["status"] == "completed", summary["error"]
    assert summary["dataset"] == "regression" and summary["model"] == "linear"
    evals = [e for e in events if e["kind"] == "eval"]
    assert evals and all(e["accuracy"] is None for e in evals)
    assert all("perplexity" not in e for e in evals)
    test = [e["loss"] for e in evals if e["split"] == "test"]
    assert test[-1] < test[0] / 10  # from ≈ ½·Var(y) towards the noise floor ½·0.01
    assert summary["final"]["accuracy"] is None and summary["best_accuracy"] is None
    assert summary["final"]["loss"] == test[-1]
    assert summary["time_to_target_s"] is None
    updates = [e for e in events if e["kind"] == "update"]
    assert all(np.isfinite(e["loss"]) for e in updates)
    sim_run(tmp_path / "b")
    a, b = ((tmp_path / d / "events.jsonl").read_bytes() for d in ("a", "b"))
    assert a == b, "the same seed gave different events"
