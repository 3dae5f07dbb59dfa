"""The compute model (stalebench.runtime.compute): a step's time from the run's model, its
FLOPs counted on the meta device, on a named device at a stated utilization."""

from __future__ import annotations

import pytest
import torch

from stalebench.cluster import ClusterConfig
from stalebench.errors import ConfigError
from stalebench.runtime.compute import DEVICES, step_flops, step_ms
from tests.conftest import run_job


def mlp(hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(40, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10)
    )


def test_a_step_counts_forward_and_backward_matrix_products():
    b = 32
    x, y = torch.randn(b, 40), torch.randint(0, 10, (b,))
    forward = 2 * b * (40 * 64 + 64 * 10)
    # backward: every weight's gradient, and the input gradient of the second layer only
    # (the data needs none)
    backward = 2 * b * (40 * 64 + 64 * 10) + 2 * b * 64 * 10
    assert step_flops(mlp(64), x, y) == forward + backward
    # nothing is computed: the model is moved to the meta device
    big = mlp(4096)
    step_flops(big, x, y)
    assert next(big.parameters()).device.type == "meta"


def test_a_step_lasts_its_flops_at_the_devices_peak_times_utilization():
    assert step_ms(10**12, "h100", "bf16", 0.5) == pytest.approx(1000 / (989.4 * 0.5))
    assert step_ms(10**12, "v100", "fp32", 1.0) == pytest.approx(1000 / 15.7)
    assert {"v100", "a100", "h100"} <= set(DEVICES)
    assert all(d.source for d in DEVICES.values())


@pytest.mark.parametrize(
    "kw,key",
    [
        ({"device": "tpu"}, "cluster.device"),
        ({"device": "v100", "precision": "bf16"}, "cluster.precision"),
        ({"device": "a100", "utilization": 1.5}, "cluster.utilization"),
        ({"device": "a100", "utilization": 0.0}, "cluster.utilization"),
    ],
)
def test_device_keys_are_checked_by_name(kw, key):
    with pytest.raises(ConfigError, match=key):
        ClusterConfig(**kw)


@pytest.mark.timeout(60)
def test_a_run_on_a_device_has_steps_that_follow_its_model(tmp_path):
    base = ["runtime=sim", "algorithm=asp", "cluster.device=v100", "budget.max_updates=12"]
    small = run_job(tmp_path / "small", [*base, "model.hidden=[64]"])
    large = run_job(tmp_path / "large", [*base, "model.hidden=[256]"])
    step = {
        name: {e["compute_s"] for e in run.events if e["kind"] == "update"}
        for name, run in (("small", small), ("large", large))
    }
    assert len(step["small"]) == len(step["large"]) == 1  # constant compute: one mean
    # 4× the hidden width: 4× the FLOPs of both layers, 4× the step
    assert step["large"].pop() == pytest.approx(4 * step["small"].pop(), rel=1e-9)
    compute = large.summary["compute"]
    assert compute["device"] == "v100" and compute["compute_ms"] > 0
