"""The pipeline engine against docs/algorithms.md §10: each stage optimizer's rule, the 1F1B and
GPipe op orders and their timelines, the stage split, and the simulator's numerics against
references written here from the definitions (§10.7 and the §12 reductions)."""

from __future__ import annotations

import json
import math
from itertools import pairwise
from pathlib import Path

import pytest
import torch
from torch.func import functional_call

from stalebench import experiment
from stalebench.algorithms.pipeline import (
    OPTIMIZERS,
    AdamConfig,
    NAdamConfig,
    NesterovPPConfig,
    PipelineConfig,
    stage_hyper,
)
from stalebench.data import Chars, CharsConfig, generated_corpus
from stalebench.engines.pipeline.program import build_stages, microbatches
from stalebench.engines.pipeline.stage import ops, split
from stalebench.errors import ConfigError
from stalebench.job import Job
from stalebench.metrics.events import read_events
from stalebench.models.nets import decoder
from tests.conftest import compose

# a small 4-block decoder on a short generated corpus: a sim step takes milliseconds
SMALL = [
    "model.width=32",
    "model.heads=2",
    "dataset.context=16",
    "dataset.batch_size=8",
    "dataset.corpus_chars=20000",
    "dataset.corpus_words=120",
    "algorithm.optimizer.warmup_steps=0",
    "eval.train_samples=0",
    "eval.every_updates=10",
    "logger=none",
    "runtime=sim",
]


def sim(tmp_path: Path, *overrides: str) -> tuple[dict, list[dict]]:
    cfg = compose(["algorithm=pipedream", *SMALL, *overrides])
    cfg.run_dir = str(tmp_path)
    summary = experiment.run(cfg)
    return summary, read_events(tmp_path / "events.jsonl")


def losses(events: list[dict], stage: int) -> list[float]:
    ups = sorted(
        (e for e in events if e["kind"] == "update" and e["worker"] == stage),
        key=lambda e: e["clock"],
    )
    return [e["loss"] for e in ups]


# ------------------------------------------------------------------- stage optimizers


@pytest.mark.parametrize("psi", [0.004, 1 / 3])  # the code's ψ, and the small sweep's
def test_nadamw_is_torch_nadam_with_decoupled_weight_decay_and_the_10_2_formula(psi):
    cfg = NAdamConfig(name="nadamw", lr=0.01, weight_decay=0.1, momentum_decay=psi)
    w = torch.tensor([1.0, -2.0, 0.5])
    opt = OPTIMIZERS.build(cfg, w)
    grads = [
        torch.tensor([0.3, -0.1, 2.0]),
        torch.tensor([-0.2, 0.4, 1.0]),
        torch.tensor([0.5, 0.5, -1.0]),
    ]
    # §10.2's per-element NAdam step, written out
    ref, m, v, mu_prod = torch.tensor([1.0, -2.0, 0.5]), 0.0, 0.0, 1.0
    b1, b2, eps, lr, wd = 0.99, 0.999, 1e-8, 0.01, 0.1
    for t, g in enumerate(grads, 1):
        opt.step(g, lr, b1)
        mu_t = b1 * (1 - 0.5 * 0.96 ** (t * psi))
        mu_next = b1 * (1 - 0.5 * 0.96 ** ((t + 1) * psi))
        mu_prod *= mu_t
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat = mu_next * m / (1 - mu_prod * mu_next) + (1 - mu_t) * g / (1 - mu_prod)
        ref = ref * (1 - lr * wd)
        ref = ref - lr * m_hat / ((v / (1 - b2**t)).sqrt() + eps)
        torch.testing.assert_close(w, ref, rtol=1e-6, atol=1e-7)
    assert torch.equal(opt.point(), w)  # the Adam family evaluates at the weights


def test_nadam_momentum_schedule_and_its_scaling_to_a_shorter_run():
    """§10.6: torch NAdam's μ_t = β₁(1 − ½·0.96^{tψ}). The code's ψ = 0.004 over its 50,000
    steps reaches 0.89 at 10k steps and 0.99 at the end, but stays near 0.5 over a 600-step
    run; ψ scaled by 50,000/600 (sweep.params.momentum_decay of sweeps/nesterov_pp.yaml)
    gives the code's μ at the same fraction of the run. The optimizer's own state
    (mu_product) follows the schedule."""

    def mu(t: int, psi: float) -> float:
        return 0.99 * (1 - 0.5 * 0.96 ** (t * psi))

    assert mu(600, 0.004) < 0.55 and mu(10_000, 0.004) == pytest.approx(0.89, abs=0.01)
    assert mu(50_000, 0.004) == pytest.approx(0.99, abs=1e-3)
    scaled = 0.004 * 50_000 / 600
    for fraction in (0.01, 0.2, 0.5, 1.0):
        assert mu(round(600 * fraction), scaled) == pytest.approx(
            mu(round(50_000 * fraction), 0.004), abs=1e-3
        )
    w = torch.zeros(3)
    opt = OPTIMIZERS.build(NAdamConfig(name="nadamw", momentum_decay=scaled), w)
    product = 1.0
    for t in range(1, 11):
        opt.step(torch.ones(3), 1e-3, 0.99)
        product *= mu(t, scaled)
    state = opt.opt.state[opt.param]
    assert float(state["mu_product"]) == pytest.approx(product, rel=1e-6)


def test_nadam_momentum_decay_must_be_non_negative():
    with pytest.raises(ConfigError, match=r"algorithm\.optimizer\.momentum_decay must be >= 0"):
        NAdamConfig(name="nadamw", momentum_decay=-0.1)


def test_adamw_is_torch_adamw():
    cfg = AdamConfig(name="adamw", lr=0.01, weight_decay=0.1)
    w = torch.tensor([1.0, -2.0, 0.5])
    p = torch.nn.Parameter(w.clone())
    ref = torch.optim.AdamW([p], lr=0.01, betas=(0.9, 0.999), weight_decay=0.1)
    opt = OPTIMIZERS.build(cfg, w)
    for g in (torch.tensor([0.3, -0.1, 2.0]), torch.tensor([-0.2, 0.4, 1.0])):
        opt.step(g, 0.01, 0.9)
        p.grad = g.clone()
        ref.step()
        torch.testing.assert_close(w, p.detach())


@pytest.mark.parametrize("discount", [True, False])
def test_nesterov_pp_is_the_papers_equation(discount):
    lr, gamma = 0.1, 0.9
    w = torch.tensor([1.0, 2.0])
    opt = OPTIMIZERS.build(
        NesterovPPConfig(name="nesterov_pp", lr=lr, beta1=gamma, discount=discount), w
    )
    scale = lr * (1 - gamma) if discount else lr
    hist = [torch.tensor([1.0, 2.0])]  # w_0, with w_{-1} = w_0 (d_0 = 0)
    for g in (torch.tensor([1.0, -1.0]), torch.tensor([0.5, 0.5]), torch.tensor([-2.0, 1.0])):
        prev = hist[-2] if len(hist) > 1 else hist[-1]
        d = gamma * (hist[-1] - prev)
        torch.testing.assert_close(opt.point(), hist[-1] + d)  # the look-ahead w_t + d_t
        opt.step(g, lr, gamma)
        hist.append(hist[-1] + d - scale * g)  # w_{t+1} = w_t + d_t − η(1−γ)g
        torch.testing.assert_close(w, hist[-1])


def test_stage_dependent_momentum_and_learning_rate():
    pipe = PipelineConfig(stages=4, adaptive_momentum=True, lr_correction_steps=10)
    opt = NesterovPPConfig(name="nesterov_pp", lr=0.1, beta1=0.9)
    # γ_k = γ₀ + τ_k (0.99 − γ₀)/K and η_k = η / τ_k^p, p = 1 − (step + 1)/10 (AsyncPP's)
    assert stage_hyper(pipe, opt, 0, 0) == pytest.approx((0.1 / 3**0.9, 0.9 + 3 * 0.09 / 4))
    assert stage_hyper(pipe, opt, 1, 5) == pytest.approx((0.1 / 2**0.4, 0.9 + 2 * 0.09 / 4))
    assert stage_hyper(pipe, opt, 3, 0) == pytest.approx((0.1, 0.9))  # τ = 0: unchanged
    assert stage_hyper(pipe, opt, 0, 20) == pytest.approx((0.1, 0.9 + 3 * 0.09 / 4))


# ------------------------------------------------------------- schedules and the split


def test_1f1b_op_order_and_delays():
    pipe = PipelineConfig(stages=4)
    assert [pipe.delay(k) for k in range(4)] == [3, 2, 1, 0]
    first = [op for op, _ in zip(ops(1, pipe), range(8), strict=False)]
    assert first == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("U", 0), ("F", 3), ("B", 1), ("U", 1)]
    last = [op for op, _ in zip(ops(3, pipe), range(6), strict=False)]
    assert last == [("F", 0), ("B", 0), ("U", 0), ("F", 1), ("B", 1), ("U", 1)]


def test_gpipe_op_order_flushes_every_step():
    pipe = PipelineConfig(stages=4, schedule="gpipe", microbatches=3)
    assert pipe.delay(0) == 0
    got = [op for op, _ in zip(ops(0, pipe), range(8), strict=False)]
    assert got == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2), ("U", 0), ("F", 3)]


def update_times(events: list[dict], stage: int) -> list[float]:
    ups = [e for e in events if e["kind"] == "update" and e["worker"] == stage]
    return [e["t"] for e in sorted(ups, key=lambda e: e["version"])]


def test_in_the_simulator_1f1b_is_fully_busy_and_gpipe_pays_the_bubble(tmp_path):
    # compute_ms = 30: a microbatch's forward f = 10 ms, backward b = 20 ms on each stage
    K, M, step = 4, 4, 0.030
    _, events = sim(tmp_path / "1f1b", "budget.max_updates=40", "cluster.compute_ms=30")
    for k in range(K):  # after warm-up every stage updates once per f + b (fully busy)
        t = update_times(events, k)
        assert [round(b - a, 9) for a, b in pairwise(t[10:])] == [step] * 29
    # the last stage's first update: the forward through all K stages, then its backward
    assert update_times(events, K - 1)[0] == pytest.approx(K * step / 3 + 2 * step / 3)
    gpipe = ["algorithm=gpipe", f"algorithm.pipeline.microbatches={M}", "cluster.compute_ms=120"]
    _, events = sim(tmp_path / "gpipe", "budget.max_updates=5", *gpipe)
    t = update_times(events, 0)  # fill and drain: a step takes (M + K − 1)(f + b)
    assert t[0] == pytest.approx((M + K - 1) * step)
    assert [round(b - a, 9) for a, b in pairwise(t)] == [round((M + K - 1) * step, 9)] * 4


def test_split_spreads_blocks_and_keeps_embedding_and_head_at_the_ends():
    model = decoder(vocab=10, context=8, width=16, heads=2, layers=5)
    stages = split(model, 3)
    assert [len(s) for s in stages] == [1 + 2, 2, 1 + 1]
    assert sum(p.numel() for s in stages for p in s.parameters()) == sum(
        p.numel() for p in model.parameters()
    )
    with pytest.raises(ConfigError, match="algorithm.pipeline.stages=6 exceeds model.layers=5"):
        split(model, 6)


# ------------------------------------------------------------------------- the data


def test_chars_reads_a_text_file_into_shifted_sequences(tmp_path):
    path = tmp_path / "input.txt"
    text = "hello world, " * 50
    path.write_text(text)
    splits = Chars(CharsConfig(name="chars", path=str(path), context=8)).load()
    vocab = sorted(set(text))
    assert splits.num_classes == len(vocab)
    decode = lambda ids: "".join(vocab[i] for i in ids)  # noqa: E731
    assert decode(splits.x_train[0]) == text[:8]
    assert decode(splits.y_train[0]) == text[1:9]
    assert torch.equal(splits.x_train[0, 1:], splits.y_train[0, :-1])
    assert splits.x_train.shape[1] == 8 and len(splits.x_test) >= 2


def test_chars_errors_name_the_path(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(ConfigError, match=f"dataset.path: cannot read text file '{missing}'"):
        Chars(CharsConfig(name="chars", path=str(missing))).prepare()
    (tmp_path / "short.txt").write_text("abc")
    with pytest.raises(ConfigError, match="has 3 characters"):
        Chars(CharsConfig(name="chars", path=str(tmp_path / "short.txt"))).prepare()


def test_generated_corpus_is_seeded_and_structured():
    a, b = generated_corpus(5000, 0), generated_corpus(5000, 0)
    assert a == b and a != generated_corpus(5000, 1) and len(a) == 5000
    words = a.lower().replace(".", "").split()
    assert len(set(words)) <= 120  # a closed vocabulary of words


# ------------------------------------------------- the simulator against the definitions


def reference_run(cfg, stash: bool, steps: int) -> list[float]:
    """§10.7 written independently of Stage: per stage a list of weight versions; step m
    forwards stage k at version max(m − τ_k, 0), backpropagates at that version (stash) or
    at the current one (no stash, recomputing from the stored input), and every stage's
    AdamW steps its current weights."""
    job = Job.build(cfg)
    pipe = cfg.algorithm.pipeline
    _, modules, _ = build_stages(job)
    K = pipe.stages
    names = [[n for n, _ in mod.named_parameters()] for mod in modules]
    hist = [[[p.detach().clone() for p in mod.parameters()]] for mod in modules]
    cur = [[p.detach().clone() for p in mod.parameters()] for mod in modules]
    opt_cfg = cfg.algorithm.optimizer
    opts = [torch.optim.AdamW(c, lr=opt_cfg.lr, weight_decay=opt_cfg.weight_decay) for c in cur]
    stream = microbatches(job)
    out = []

    def call(k, ws, x):
        return functional_call(modules[k], dict(zip(names[k], ws, strict=True)), (x,))

    for m in range(steps):
        x, y = next(stream)
        fwd = [hist[k][max(m - pipe.delay(k), 0)] for k in range(K)]
        inputs = []
        h = x
        for k in range(K - 1):
            inputs.append(h)
            with torch.no_grad():
                h = call(k, fwd[k], h)
        inputs.append(h)
        grad_out = None
        for k in reversed(range(K)):
            ws = [
                w.detach().clone().requires_grad_(True) for w in (fwd[k] if stash else hist[k][m])
            ]
            xin = inputs[k].detach().requires_grad_(inputs[k].is_floating_point())
            res = call(k, ws, xin)
            if k == K - 1:
                res = torch.nn.functional.cross_entropy(res.flatten(0, 1), y.flatten())
                out.append(res.item())
                res.backward()
            else:
                res.backward(grad_out)
            grad_out = xin.grad
            for c, w in zip(cur[k], ws, strict=True):
                c.grad = w.grad
        for k in range(K):
            opts[k].step()
            hist[k].append([c.detach().clone() for c in cur[k]])
    return out


@pytest.mark.parametrize("stash", [True, False], ids=["weight-stashing", "no-stashing"])
def test_sim_matches_the_107_recipe(tmp_path, stash):
    extra = [
        f"algorithm.pipeline.weight_stashing={str(stash).lower()}",
        "algorithm.pipeline.clip_norm=0",
        "budget.max_updates=12",
    ]
    _, events = sim(tmp_path, *extra)
    cfg = compose(["algorithm=pipedream", *SMALL, *extra])
    ref = reference_run(cfg, stash, 12)
    assert losses(events, 3) == pytest.approx(ref, rel=1e-5, abs=1e-6)
    for k, tau in enumerate([3, 2, 1, 0]):  # lag = τ_k once the warm-up is over
        lags = [e["lag"] for e in events if e["kind"] == "update" and e["worker"] == k]
        assert lags == [min(m, tau) for m in range(12)]


def test_k1_equals_plain_nadamw_training(tmp_path):
    """§12: Nesterov-PP's simulator with K = 1 is plain NAdamW training."""
    extra = [
        "algorithm.pipeline.stages=1",
        "algorithm.pipeline.clip_norm=0",
        "budget.max_updates=15",
        "algorithm.optimizer.weight_decay=0.01",
    ]
    _, events = sim(tmp_path, "algorithm=nesterov_pp", *extra)
    cfg = compose(["algorithm=nesterov_pp", *SMALL, *extra])
    job = Job.build(cfg)
    model = job.model()
    opt = torch.optim.NAdam(
        model.parameters(),
        lr=cfg.algorithm.optimizer.lr,
        betas=(0.99, 0.999),
        weight_decay=0.01,
        momentum_decay=0.004,
        decoupled_weight_decay=True,
    )
    ref, stream = [], microbatches(job)
    for _ in range(15):
        x, y = next(stream)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref.append(loss.item())
    assert losses(events, 0) == pytest.approx(ref, rel=1e-5)
    saved = torch.load(tmp_path / "model.pt")
    for (name, p), q in zip(model.state_dict().items(), saved.values(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-6, msg=name)


def test_all_delays_zero_equals_unpipelined_training(tmp_path):
    """§12: GPipe with one microbatch (τ_k = 0 everywhere) on 4 stages = 1 stage."""
    a, ea = sim(
        tmp_path / "a",
        "algorithm=gpipe",
        "algorithm.pipeline.microbatches=1",
        "algorithm.pipeline.clip_norm=0",
        "budget.max_updates=15",
    )
    b, eb = sim(
        tmp_path / "b",
        "algorithm=gpipe",
        "algorithm.pipeline.microbatches=1",
        "algorithm.pipeline.clip_norm=0",
        "algorithm.pipeline.stages=1",
        "budget.max_updates=15",
    )
    assert losses(ea, 3) == pytest.approx(losses(eb, 0), rel=1e-5)
    assert a["final"]["loss"] == pytest.approx(b["final"]["loss"], rel=1e-5)
    assert {e["lag"] for e in ea if e["kind"] == "update"} == {0}


def test_gpipe_averages_its_microbatches(tmp_path):
    """4 microbatches of 2 = one minibatch of 8 (no BatchNorm: the mean gradient is the
    same), so GPipe M=4 tracks M=1 closely."""
    _, e4 = sim(tmp_path / "a", "algorithm=gpipe", "budget.max_updates=8")
    _, e1 = sim(
        tmp_path / "b",
        "algorithm=gpipe",
        "algorithm.pipeline.microbatches=1",
        "budget.max_updates=8",
    )
    assert losses(e4, 0) == pytest.approx(losses(e1, 0), rel=1e-4)


def test_sim_summary_reports_delays_gaps_and_perplexity(tmp_path):
    summary, events = sim(tmp_path, "budget.max_updates=30")
    assert summary["status"] == "completed"
    assert summary["engine"] == "pipeline" and summary["num_workers"] == 4
    assert summary["parts"] == {"pipeline": "async_1f1b", "optimizer": "adamw"}
    assert summary["barrier"] is None and summary["update_rule"] is None  # no barrier here
    assert summary["stage_delay"] == [3, 2, 1, 0]
    assert summary["pipeline"]["delays"] == [3, 2, 1, 0]
    gaps = summary["weight_gap"]["per_stage"]
    assert gaps[0] > gaps[3] > 0  # more delay, further from the weights updated
    assert summary["final"]["perplexity"] == pytest.approx(math.exp(summary["final"]["loss"]))
    vals = sorted((e for e in events if e["kind"] == "eval"), key=lambda e: e["version"])
    assert [e["version"] for e in vals] == [0, 10, 20, 30]
    assert vals[-1]["loss"] < vals[0]["loss"]
    assert json.loads((tmp_path / "summary.json").read_text()) == summary


def test_the_1_minus_gamma_discount_is_what_keeps_the_equation_stable(tmp_path):
    """§10.2's ablation: the same η without the (1 − γ) discount is a 1/(1 − γ) = 100×
    larger step; training blows up (the paper's Fig. 7) where the method learns."""
    base = [
        "algorithm=nesterov_pp",
        "algorithm/optimizer=nesterov_pp",
        "algorithm.optimizer.lr=1.0",
        "budget.max_updates=60",
    ]

    def val(events):
        evals = sorted((e for e in events if e["kind"] == "eval"), key=lambda e: e["version"])
        return [e["loss"] for e in evals]

    good, good_events = sim(tmp_path / "a", *base)
    bad, bad_events = sim(tmp_path / "b", *base, "algorithm.optimizer.discount=false")
    assert good["status"] == "completed"
    start, end = val(good_events)[0], val(good_events)[-1]
    assert end < start - 0.8, val(good_events)
    assert bad["status"] == "diverged" or not val(bad_events)[-1] < start, val(bad_events)


def test_learning_rate_warms_up_then_follows_a_cosine_to_its_floor():
    from stalebench.algorithms.pipeline import scheduled_lr

    opt = AdamConfig(name="adamw", lr=1.0, warmup_steps=4, cosine_steps=10, min_lr_ratio=0.1)
    assert [scheduled_lr(opt, s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert scheduled_lr(opt, 4) == 1.0
    assert scheduled_lr(opt, 9) == pytest.approx(0.1 + 0.9 * 0.5)  # half way down
    assert scheduled_lr(opt, 14) == pytest.approx(0.1) == scheduled_lr(opt, 100)
    assert scheduled_lr(AdamConfig(name="adamw", lr=0.3), 50) == 0.3


def test_sim_virtual_time_shows_the_gpipe_bubble(tmp_path):
    """1F1B keeps every stage busy after warm-up; GPipe's fill and drain leave a stage busy
    M/(M + K − 1) of the time (4/7 for M = K = 4), and its steps take that much longer."""
    one_f1b, _ = sim(tmp_path / "a", "budget.max_updates=40", "cluster.compute_ms=30")
    gpipe, _ = sim(
        tmp_path / "b", "algorithm=gpipe", "budget.max_updates=40", "cluster.compute_ms=30"
    )
    assert one_f1b["compute_fraction"] > 0.9
    assert gpipe["compute_fraction"] == pytest.approx(4 / 7, abs=0.01)
    ratio = one_f1b["throughput_updates_per_s"] / gpipe["throughput_updates_per_s"]
    assert ratio == pytest.approx(7 / 4, rel=0.1)


def test_nesterov_pp_weight_decay_is_l2_through_the_gradient():
    w = torch.tensor([1.0, -2.0])
    cfg = NesterovPPConfig(name="nesterov_pp", lr=10.0, beta1=0.9, weight_decay=0.01)
    OPTIMIZERS.build(cfg, w).step(torch.tensor([0.5, 0.5]), 10.0, 0.9)
    g = torch.tensor([0.5, 0.5]) + 0.01 * torch.tensor([1.0, -2.0])
    torch.testing.assert_close(w, torch.tensor([1.0, -2.0]) - 10.0 * 0.1 * g)


def test_a_local_text_file_trains_end_to_end(tmp_path):
    text = generated_corpus(20000, 7)
    (tmp_path / "input.txt").write_text(text)
    summary, events = sim(
        tmp_path / "run", f"dataset.path={tmp_path / 'input.txt'}", "budget.max_updates=20"
    )
    assert summary["status"] == "completed"
    model = torch.load(tmp_path / "run" / "model.pt")
    assert model["0.tok.weight"].shape[0] == len(set(text))  # the file's own vocabulary
    vals = [e["loss"] for e in events if e["kind"] == "eval" and e["split"] == "test"]
    assert vals[-1] < vals[0]
