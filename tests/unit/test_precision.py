"""The arithmetic of the workers' real compute (`stalebench.precision`): precision=bf16
runs the forward pass under autocast — one gradient at a time and the simulator's batched
gradients alike —, θ and its gradient staying float32; tf32 and deterministic set torch's
flags, and a later job of the same process resets them; fp16 is refused by name; summary.json
records the choice."""

from __future__ import annotations

import json

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


@pytest.mark.parametrize("batch", ["off", "on"])
def test_a_bf16_run_trains_and_differs_from_fp32(tmp_path, batch):
    losses = {}
    for p in ("fp32", "bf16"):
        cfg = compose(fast_with([*BASE, f"precision={p}", f"sim.batch={batch}",
                                 "cluster.num_workers=3"]))  # fmt: skip
        cfg.run_dir = str(tmp_path / p)
        summary = experiment.run(cfg)
        assert summary["status"] == "completed", summary["error"]
        assert summary["arithmetic"] == {"precision": p, "deterministic": False, "compile": False}
        losses[p] = [e["loss"] for e in read_events(tmp_path / p / "events.jsonl")
                     if e["kind"] == "update"]  # fmt: skip
    assert losses["bf16"] != losses["fp32"]  # autocast took effect
    assert all(abs(a - b) < 0.05 for a, b in zip(losses["bf16"], losses["fp32"], strict=True))


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


@pytest.mark.parametrize(
    ("value", "said"),
    [("fp16", "precision=fp16: float16 needs loss scaling"), ("fp8", "precision must be")],
)
def test_a_precision_that_cannot_be_honoured_is_refused_by_name(value, said):
    with pytest.raises(ConfigError, match=said):
        compose(fast_with([*BASE, f"precision={value}"]))


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


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["compile_backend=nope"], "compile_backend: torch.compile knows no backend 'nope'"),
        (["algorithm=gpipe"], "compile=true: engine=pipeline's stages run their modules eager"),
        (["engine=allreduce", "algorithm=bsp", "engine.bucket_mb=1"],
         "compile=true: engine.bucket_mb=1: the rounds in pieces hook"),
    ],
)  # fmt: skip
def test_a_compile_that_cannot_be_honoured_is_refused_by_name(tmp_path, overrides, said):
    cfg = compose(fast_with([*BASE, "compile=true", *overrides]))
    cfg.run_dir = str(tmp_path)
    with pytest.raises(ConfigError, match=said):
        experiment.prepare(cfg)
