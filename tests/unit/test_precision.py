"""The arithmetic of the workers' real compute (`stalebench.precision`): precision=bf16
runs the forward pass under autocast — one gradient at a time and the simulator's batched
gradients alike —, θ and its gradient staying float32; tf32 and deterministic set torch's
flags, and a later job of the same process resets them; fp16 scales each worker's loss as
GradScaler does and computes an overflowed gradient again; what an engine cannot honour is
refused by name; summary.json records the choice."""

from __future__ import annotations

import json
import math

import pytest
import torch

from stalebench import experiment, precision
from stalebench.errors import ConfigError
from stalebench.job import Job
from stalebench.metrics.events import read_events
from stalebench.runtime.record import gradient
from tests.conftest import compose, fast_with

BASE = ["runtime=sim", "budget.max_updates=10"]


def job(*extra: str) -> Job:
    return Job.build(compose(fast_with([*BASE, *extra])), 2, False)


def test_bf16_computes_the_forward_pass_in_bfloat16_and_the_gradient_in_float32():
    seen = []
    j = job("precision=bf16")
    model = j.model()
    hook = model.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    x, y = j.splits.x_train[:8], j.splits.y_train[:8]
    grad, loss = gradient(model, list(model.parameters()), (x, y), torch.device("cpu"))
    assert seen == [torch.bfloat16] and grad.dtype == torch.float32
    job("precision=fp32")  # the next job of this process: float32 again
    gradient(model, list(model.parameters()), (x, y), torch.device("cpu"))
    assert seen == [torch.bfloat16, torch.float32]
    hook.remove()


def test_tf32_and_deterministic_set_torchs_flags_and_a_later_job_resets_them():
    job("precision=tf32", "deterministic=true")
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
    job()
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert not torch.are_deterministic_algorithms_enabled()
    assert not torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark


def test_a_deterministic_run_completes(tmp_path):
    cfg = compose(fast_with([*BASE, "deterministic=true"]))
    cfg.run_dir = str(tmp_path)
    summary = experiment.run(cfg)
    job()  # this process's flags back
    assert summary["status"] == "completed", summary["error"]
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["arithmetic"] == {"precision": "fp32", "deterministic": True, "compile": False}


def test_a_precision_that_cannot_be_honoured_is_refused_by_name():
    with pytest.raises(ConfigError, match="precision must be fp32, tf32, bf16 or fp16, got 'fp8'"):
        compose(fast_with([*BASE, "precision=fp8"]))


def bn_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 3)
    )


def test_fp16_unscales_a_scaled_gradient_and_computes_an_overflowed_one_again(monkeypatch):
    """precision=fp16: the gradient of the loss times the worker's scale, divided by it;
    at a scale whose gradient overflows float16 (2**40), computed again at half the scale
    until it is finite (one forward pass each), from the BatchNorm statistics as they were:
    the gradient and the statistics are those of one pass at a scale that fits."""
    job("precision=fp16")
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    got = {}
    for init in (2.0**10, 2.0**40):
        monkeypatch.setattr(precision.LossScale, "INIT", init)
        model, passes = bn_net(), []
        model.register_forward_hook(lambda m, i, out, seen=passes: seen.append(out.dtype))
        scale = precision.loss_scale(torch.device("cpu"))
        grad, loss = gradient(model, list(model.parameters()), (x, y), torch.device("cpu"),
                              None, scale, list(model.buffers()))  # fmt: skip
        halvings = round(math.log2(init / float(scale.scale)))
        assert len(passes) == 1 + halvings and passes[0] == torch.float16
        got[init] = grad, loss, model[1].running_mean.clone(), halvings
    (g10, l10, mean10, h10), (g40, l40, mean40, h40) = got[2.0**10], got[2.0**40]
    assert h10 == 0 and h40 > 0 and torch.isfinite(g40).all()
    torch.testing.assert_close(g40, g10)  # a power of two scales and unscales exactly
    assert l40 == l10 and torch.equal(mean40, mean10)
    job()
    model = bn_net()
    reference, _ = gradient(model, list(model.parameters()), (x, y), torch.device("cpu"))
    torch.testing.assert_close(g10, reference, rtol=0.02, atol=1e-3)  # float16's rounding


def test_fp16s_loss_scale_grows_after_an_interval_without_overflow(monkeypatch):
    """As GradScaler's: doubled after INTERVAL finite gradients in a row."""
    monkeypatch.setattr(precision.LossScale, "INTERVAL", 3)
    scale = precision.LossScale(torch.device("cpu"))
    for _ in range(3):
        assert scale.unscaled([torch.ones(4)])
    assert float(scale.scale) == 2.0**17
    assert not scale.unscaled([torch.tensor([1.0, math.inf])])
    assert float(scale.scale) == 2.0**16 and int(scale.tracker) == 0


@pytest.mark.parametrize("batch", ["off", "on"])
def test_half_precision_runs_train_as_fp32_and_differ_from_it(tmp_path, monkeypatch, batch):
    """bf16 and fp16 runs, one gradient at a time or batched: autocast takes effect (the
    losses differ from float32's) and they train as float32 does, to their rounding; fp16
    from a scale at which every worker's first gradient overflows (2**40): each computed
    again until finite."""
    monkeypatch.setattr(precision.LossScale, "INIT", 2.0**40)
    losses = {}
    for p in ("fp32", "bf16", "fp16"):
        cfg = compose(fast_with([*BASE, f"precision={p}", f"sim.batch={batch}",
                                 "cluster.num_workers=3"]))  # fmt: skip
        cfg.run_dir = str(tmp_path / p)
        summary = experiment.run(cfg)
        assert summary["status"] == "completed", summary["error"]
        assert summary["arithmetic"] == {"precision": p, "deterministic": False, "compile": False}
        losses[p] = [e["loss"] for e in read_events(tmp_path / p / "events.jsonl")
                     if e["kind"] == "update"]  # fmt: skip
    job()
    for half, rounding in (("bf16", 0.05), ("fp16", 1e-3)):
        assert losses[half] != losses["fp32"]
        assert losses[half] == pytest.approx(losses["fp32"], abs=rounding)


def test_autocast_where_there_is_arithmetic_only():
    import contextlib

    job("precision=bf16")
    assert isinstance(precision.autocast(torch.device("cpu")), torch.autocast)
    assert isinstance(precision.autocast(torch.device("meta")), contextlib.nullcontext)
    job()
    assert isinstance(precision.autocast(torch.device("cpu")), contextlib.nullcontext)


def test_compile_runs_the_workers_model_compiled_with_eagers_gradients(tmp_path):
    """compile=true: every process that computes runs its model through torch.compile
    (`compile_backend`; torch's `eager` here: dynamo's graphs without inductor's seconds
    of code generation), the module as built (its parameters, their names); a simulated
    run's losses are an eager run's to float rounding; summary.json records the backend."""
    from torch._dynamo.utils import counters

    losses = {}
    for flag in ("false", "true"):
        before = counters["stats"]["unique_graphs"]
        cfg = compose(fast_with([*BASE, f"compile={flag}", "compile_backend=eager",
                                 "cluster.num_workers=2"]))  # fmt: skip
        cfg.run_dir = str(tmp_path / flag)
        summary = experiment.run(cfg)
        assert summary["status"] == "completed", summary["error"]
        assert summary["arithmetic"]["compile"] == ("eager" if flag == "true" else False)
        assert (counters["stats"]["unique_graphs"] > before) is (flag == "true")
        losses[flag] = [e["loss"] for e in read_events(tmp_path / flag / "events.jsonl")
                        if e["kind"] == "update"]  # fmt: skip
    assert losses["true"] == pytest.approx(losses["false"], rel=1e-5)


BUCKETS = ["engine=allreduce", "algorithm=bsp", "engine.bucket_mb=1"]


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["compile=true", "compile_backend=nope"],
         "compile_backend: torch.compile knows no backend 'nope'"),
        (["compile=true", "algorithm=gpipe"],
         "compile=true: engine=pipeline's stages run their modules eager"),
        (["compile=true", *BUCKETS], "compile=true: engine.bucket_mb=1: the rounds in pieces hook"),
        (["precision=fp16", "algorithm=gpipe"],
         "precision=fp16: engine=pipeline's stages each run a part of"),
        (["precision=fp16", *BUCKETS],
         "precision=fp16: engine.bucket_mb=1: a piece is all-reduced as backward makes it"),
    ],
)  # fmt: skip
def test_a_compile_or_fp16_that_cannot_be_honoured_is_refused_by_name(tmp_path, overrides, said):
    cfg = compose(fast_with([*BASE, *overrides]))
    cfg.run_dir = str(tmp_path)
    with pytest.raises(ConfigError, match=said):
        experiment.prepare(cfg)
