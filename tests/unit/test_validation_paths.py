"""Every validation path, in process: each case is bad input that must be refused before
any process starts, with a message naming the config key and the bad value. Cases that
need a file or a registry are below the table. `python -m coverage` over tests/unit
reports which `raise ConfigError` sites this leaves unexecuted (see docs/testing.md)."""

from __future__ import annotations

import re

import hydra
import pytest
from omegaconf import OmegaConf

from stalebench import experiment
from stalebench.errors import ConfigError
from tests.conftest import ChoicesComposedOnce, _choices_and_values, compose, fast_with

PIPE = ["algorithm=gpipe", "dataset=chars", "model=transformer"]


@pytest.fixture(scope="module", autouse=True)
def one_fork_server():
    """experiment.prepare starts a real run's fork server (stalebench.runtime.forkserver)
    and replaces it whenever a case's engine or parts import a module the running one did
    not (an interpreter importing torch again: seconds of CPU, five times over these cases
    in file order). Started first with what every registered engine and part imports, one
    serves every case; prepare still starts it, or finds it serving, as in any process."""
    from stalebench import plugins
    from stalebench.config import ENGINES
    from stalebench.registry import PARTS, REGISTRIES
    from stalebench.runtime import forkserver

    plugins.load()
    imports = []
    for name in ENGINES.names():
        engine = ENGINES.get(name)[0]
        imports += [engine.__module__, *engine.program_modules]
    for registry in filter(None, (REGISTRIES.get(f"algorithm/{slot}") for slot in PARTS)):
        imports += [
            m for name in registry.names() for m in getattr(registry.get(name)[0], "imports", ())
        ]
    forkserver.start(list(dict.fromkeys(imports)))


# (overrides, a fragment of the message: the key and the value it names)
CASES = [
    # budget, eval, logger, run
    (["budget.max_updates=-1"], "budget.max_updates must be >= 0, got -1"),
    (["budget.max_wall_s=-1"], "budget.max_wall_s must be >= 0, got -1.0"),
    (
        ["budget.max_updates=0", "budget.max_wall_s=0"],
        "budget: set budget.max_updates or budget.max_wall_s (both are 0)",
    ),
    (["budget.target_accuracy=2"], "budget.target_accuracy must be in [0, 1], got 2.0"),
    (["budget.diverge_factor=1"], "budget.diverge_factor must be 0 (off) or > 1, got 1.0"),
    (["eval.every_updates=-1"], "eval.every_updates must be >= 0, got -1"),
    (["eval.train_samples=-1"], "eval.train_samples must be >= 0, got -1"),
    (["eval.every_s=-1"], "eval.every_s must be >= 0, got -1.0"),
    (["eval.batch_size=0"], "eval.batch_size must be >= 1, got 0"),
    (["logger.name=foo"], "logger: unknown logger 'foo'; known: none, local, wandb"),
    (
        ["logger.wandb_mode=foo"],
        "logger.wandb_mode must be one of auto, offline, online, disabled, got 'foo'",
    ),
    (["runtime=foo"], "runtime: unknown 'foo'; known: real, sim"),
    (["device=tpu"], "device must be auto, cpu or cuda, got 'tpu'"),
    (["num_threads=0"], "num_threads must be >= 1, got 0"),
    (["timeout_s=0"], "timeout_s must be > 0, got 0.0"),
    (["grace_s=-1"], "grace_s must be > 0, got -1.0"),
    (["checkpoint_every_s=-1"], "checkpoint_every_s must be >= 0, got -1.0"),
    (["resume_unreadable=maybe"], "resume_unreadable must be error or restart, got 'maybe'"),
    (
        ["runtime=sim", "algorithm=asp", "checkpoint_every_s=5"],
        "checkpoint_every_s=5: engine=ps keeps none in runtime=sim (set it to 0, or leave it "
        "unset)",
    ),
    (["seed=-1"], "seed must be >= 0, got -1"),
    (["listen_host=localhost"], "listen_host must be an IP address, got 'localhost'"),
    # no number may be NaN or infinite, at any depth (NaN passes every comparison)
    (["budget.max_wall_s=nan"], "budget.max_wall_s must be a finite number, got nan"),
    (["cluster.push_latency_ms=inf"], "cluster.push_latency_ms must be a finite number, got inf"),
    (["cluster.slowdown=[1,1,1,inf]"], "cluster.slowdown[3] must be a finite number, got inf"),
    (
        ["cluster.faults=[{worker:0,at_s:nan}]"],
        "cluster.faults[0].at_s must be a finite number, got nan",
    ),
    # cluster
    (["cluster.num_workers=0"], "cluster.num_workers must be >= 1, got 0"),
    (["cluster.spares=-1"], "cluster.spares must be >= 0, got -1"),
    (
        ["algorithm=ssp", "cluster.spares=1"],
        "cluster.spares=1: a spare takes a lost worker's place only under a barrier that "
        "never waits (asp and the update rules on it), not algorithm.barrier=ssp",
    ),
    (
        ["algorithm=gpipe", "cluster.spares=2"],
        "cluster.spares=2: engine=pipeline cannot hand a lost worker's place to a spare; "
        "engine=ps can, and engine=allreduce, local or gossip with cluster.min_replicas",
    ),
    (
        ["algorithm=osgp", "cluster.min_replicas=2"],
        "cluster.min_replicas=2: with algorithm.gossip.overlap=1 the shares sent to a lost "
        "node in the last τ iterations cannot come back; use overlap 0 (SGP, D-PSGD)",
    ),
    (
        ["algorithm=sgp", "cluster.spares=2"],
        "cluster.spares=2: engine=gossip hands a lost worker's place to a spare in rounds "
        "that go on over the replicas left: set cluster.min_replicas too",
    ),
    (
        ["algorithm=diloco", "cluster.spares=2"],
        "cluster.spares=2: engine=local hands a lost worker's place to a spare in rounds "
        "that go on over the replicas left: set cluster.min_replicas too",
    ),
    (["cluster.min_replicas=9"], "cluster.min_replicas must be in [0, num_workers=4], got 9"),
    (
        ["algorithm=gpipe", "cluster.min_replicas=2"],
        "cluster.min_replicas=2: engine=pipeline has no rounds to go on with the replicas left; "
        "engine=allreduce, local and gossip have",
    ),
    (
        [
            "algorithm=bsp",
            "engine=allreduce",
            "runtime=real",
            "engine.bucket_mb=1",
            "cluster.min_replicas=2",
        ],
        "cluster.min_replicas=2: engine.bucket_mb=1.0 sends a round in pieces, which cannot go "
        "on over the replicas left (set engine.bucket_mb=0, or runtime=sim)",
    ),  # fmt: skip
    (
        ["dataset.shuffle=sometimes"],
        "dataset.shuffle must be one of auto, randperm, affine, got 'sometimes'",
    ),
    (
        ["algorithm=lsgd", "cluster.min_replicas=2"],
        "cluster.min_replicas=2: algorithm.outer=leader cannot go on over the replicas left "
        "(a rule that averages, with quantize none or fp16, can)",
    ),
    (
        ["algorithm=diloco", "engine.quantize=int8", "cluster.min_replicas=2"],
        "cluster.min_replicas=2: engine.quantize=int8 cannot go on over the replicas left "
        "(a rule that averages, with quantize none or fp16, can)",
    ),
    (
        ["algorithm=hpsgd", "cluster.min_replicas=2", "cluster.spares=1"],
        "cluster.spares=1: engine.mode=overlap has an exchange in flight at every merge, "
        "which a spare joining then would not be part of (spares join engine.mode=sync, or "
        "streaming with engine.delay=0)",
    ),
    (
        ["algorithm=bsp", "engine=allreduce", "cluster.spares=2"],
        "cluster.spares=2: engine=allreduce hands a lost worker's place to a spare in rounds "
        "that go on over the replicas left: set cluster.min_replicas too",
    ),
    (
        ["cluster.faults=[{worker:0,at_s:1,action:slow}]"],
        "cluster.faults[0].delay_ms must be > 0 with action slow, else 0, got 0.0",
    ),
    (
        ["cluster.compute=foo"],
        "cluster.compute must be one of constant, gamma, lognormal, trace, got 'foo'",
    ),
    (["cluster.push_latency_ms=-1"], "cluster.push_latency_ms must be >= 0, got -1.0"),
    (
        ["cluster.compute=gamma", "cluster.compute_ms=0"],
        "cluster.compute_ms must be > 0 for compute=gamma, got 0.0",
    ),
    (
        ["cluster.compute=lognormal", "cluster.compute_ms=0"],
        "cluster.compute_ms must be > 0 for compute=lognormal, got 0.0",
    ),
    (["cluster.gamma_shape=0"], "cluster.gamma_shape must be > 0, got 0.0"),
    (["cluster.lognormal_sigma=-1"], "cluster.lognormal_sigma must be >= 0, got -1.0"),
    (["cluster.compute=trace"], "cluster.trace_file must be a CSV path for compute=trace, got ''"),
    (
        ["cluster.slowdown=[1,1]"],
        "cluster.slowdown must be one multiplier per worker (cluster.num_workers=4), "
        "got [1.0, 1.0]",
    ),
    (
        ["cluster.slowdown=[1,0.5,1,1]"],
        "cluster.slowdown must be multipliers >= 1, got [1.0, 0.5, 1.0, 1.0]",
    ),
    (["cluster.slow_fraction=2"], "cluster.slow_fraction must be in [0, 1], got 2.0"),
    (["cluster.slow_factor=0.5"], "cluster.slow_factor must be >= 1, got 0.5"),
    (
        ["cluster.slow_factor=2", "cluster.slow_factor_max=1.5"],
        "cluster.slow_factor_max must be >= cluster.slow_factor (or 0), got 1.5",
    ),
    (["cluster.straggler_prob=2"], "cluster.straggler_prob must be in [0, 1], got 2.0"),
    (["cluster.straggler_factor=0.5"], "cluster.straggler_factor must be >= 1, got 0.5"),
    (["cluster.faults=[{worker:4}]"], "cluster.faults[0].worker must be in [0, 4), got 4"),
    (
        ["cluster.faults=[{action:explode}]"],
        "cluster.faults[0].action must be one of pause, die, slow, slow_compute, got 'explode'",
    ),
    (
        ["cluster.faults=[{at_s:-1}]"],
        "cluster.faults[0] must be at_s >= 0 and duration_s >= 0, got FaultConfig(worker=0, "
        "at_s=-1.0, action='pause', duration_s=0.0, at_step=-1, delay_ms=0.0, factor=1.0, "
        "duration_steps=0)",
    ),
    (
        ["cluster.faults=[{at_s:0.5,at_step:0}]"],
        "cluster.faults[0] must be at_step >= 0 (with at_s 0) or at_step -1 (by time), got "
        "FaultConfig(worker=0, at_s=0.5, action='pause', duration_s=0.0, at_step=0, delay_ms=0.0, "
        "factor=1.0, duration_steps=0)",
    ),
    (
        ["cluster.faults=[{at_s:2,at_step:3}]"],
        "cluster.faults[0] must be at_step >= 0 (with at_s 0) or at_step -1 (by time), got "
        "FaultConfig(worker=0, at_s=2.0, action='pause', duration_s=0.0, at_step=3, delay_ms=0.0, "
        "factor=1.0, duration_steps=0)",
    ),
    # slow_compute: a multiplier of the worker's step times from a step on, for some steps
    (
        ["cluster.faults=[{worker:1,at_s:2,action:slow_compute,factor:3}]"],
        "cluster.faults[0].at_s must be 0 with action slow_compute (it starts at a step: set "
        "at_step), got 2.0",
    ),
    (
        ["cluster.faults=[{worker:1,action:slow_compute,factor:3}]"],
        "cluster.faults[0].at_step must be >= 0 with action slow_compute, got -1",
    ),
    (
        ["cluster.faults=[{worker:1,at_step:5,action:slow_compute,factor:3,duration_s:1}]"],
        "cluster.faults[0].duration_s must be 0 with action slow_compute (it lasts steps: set "
        "duration_steps), got 1.0",
    ),
    (
        ["cluster.faults=[{worker:1,at_step:5,action:slow_compute}]"],
        "cluster.faults[0].factor must be > 1 with action slow_compute, got 1.0",
    ),
    (
        ["cluster.faults=[{worker:1,at_step:5,action:slow_compute,factor:0.5}]"],
        "cluster.faults[0].factor must be > 1 with action slow_compute, got 0.5",
    ),
    (
        ["cluster.faults=[{worker:1,at_step:5,action:slow_compute,factor:3,duration_steps:-1}]"],
        "cluster.faults[0].duration_steps must be >= 0 (0 = to the end), got -1",
    ),
    (
        ["cluster.faults=[{worker:1,at_step:5,action:pause,duration_s:1,factor:3}]"],
        "cluster.faults[0] must be factor 1 and duration_steps 0 unless action is slow_compute, "
        "got FaultConfig(worker=1, at_s=0.0, action='pause', duration_s=1.0, at_step=5, "
        "delay_ms=0.0, factor=3.0, duration_steps=0)",
    ),
    (
        ["cluster.faults=[{worker:1,at_s:1,action:die,duration_steps:4}]"],
        "cluster.faults[0] must be factor 1 and duration_steps 0 unless action is slow_compute, "
        "got FaultConfig(worker=1, at_s=1.0, action='die', duration_s=0.0, at_step=-1, "
        "delay_ms=0.0, factor=1.0, duration_steps=4)",
    ),
    # faults given by an interpolation (a sweep's shared disturbance) arrive untyped
    (
        ["+sweep=sync_bends", "+sweep/arms/sync_bends=dbs_disturbed", "sweep.params.disturbance=5"],
        "cluster.faults must be a list of faults, got 5",
    ),
    (
        [
            "+sweep=sync_bends",
            "+sweep/arms/sync_bends=dbs_disturbed",
            "sweep.params.disturbance=[{worker:7,speed:3}]",
        ],
        "cluster.faults[0] must be a fault (worker, at_s, action, duration_s, at_step, "
        "delay_ms, factor, duration_steps), got {'worker': 7, 'speed': 3}: Key 'speed' not in "
        "'FaultConfig'",
    ),
    # algorithms
    (
        ["algorithm=asp", "algorithm.barrier.apply=per_round"],
        "algorithm.barrier.apply must be 'per_arrival' for asp, got 'per_round'",
    ),
    (
        ["algorithm=ssp", "algorithm.barrier.on_loss=wait"],
        "algorithm.barrier.on_loss must be 'fail' or 'reform', got 'wait'",
    ),
    (
        ["algorithm=dssp", "algorithm.barrier.on_loss=reform"],
        "algorithm.barrier.on_loss=reform: barrier dssp decides from more than the slowest "
        "clock and cannot be re-formed over the survivors; bsp, ssp can",
    ),
    (
        ["algorithm=bsp", "engine=allreduce", "algorithm.barrier.on_loss=reform"],
        "algorithm.barrier=bsp with on_loss=reform needs the barrier re-formed over the "
        "workers left when one is lost (a server), which engine=allreduce does not give: use "
        "engine=ps, or leave algorithm.barrier.on_loss at its default",
    ),
    (
        ["algorithm=bsp", "algorithm.barrier.apply=per_arrival"],
        "algorithm.barrier.apply must be 'per_round' for bsp (ssp with staleness=0 applies per "
        "arrival), got 'per_arrival'",
    ),
    (["algorithm.barrier.staleness=-1"], "algorithm.barrier.staleness must be >= 0, got -1"),
    ([*PIPE, "algorithm.pipeline.stages=0"], "algorithm.pipeline.stages must be >= 1, got 0"),
    (
        [*PIPE, "algorithm.pipeline.schedule=foo"],
        "algorithm.pipeline.schedule must be one of async_1f1b, gpipe, got 'foo'",
    ),
    (
        [*PIPE, "algorithm.pipeline.microbatches=0"],
        "algorithm.pipeline.microbatches must be >= 1, got 0",
    ),
    (
        [*PIPE, "algorithm.pipeline.clip_norm=-1"],
        "algorithm.pipeline.clip_norm must be >= 0, got -1.0",
    ),
    (
        [*PIPE, "algorithm.pipeline.lr_correction_steps=-1"],
        "algorithm.pipeline.lr_correction_steps must be >= 0, got -1",
    ),
    ([*PIPE, "algorithm.optimizer.lr=0"], "algorithm.optimizer.lr must be > 0, got 0.0"),
    (
        [*PIPE, "algorithm.optimizer.warmup_steps=-1"],
        "algorithm.optimizer.warmup_steps must be >= 0, got -1",
    ),
    (
        [*PIPE, "algorithm.optimizer.cosine_steps=-1"],
        "algorithm.optimizer.cosine_steps must be >= 0, got -1",
    ),
    (
        [*PIPE, "algorithm.optimizer.min_lr_ratio=2"],
        "algorithm.optimizer.min_lr_ratio must be in [0, 1], got 2.0",
    ),
    (
        [*PIPE, "algorithm.optimizer.beta1=1.5"],
        "algorithm.optimizer.beta1 must be in [0, 1), got 1.5",
    ),
    (
        [*PIPE, "algorithm.optimizer.weight_decay=-1"],
        "algorithm.optimizer.weight_decay must be >= 0, got -1.0",
    ),
    (
        [*PIPE, "algorithm.optimizer.beta2=1"],
        "algorithm.optimizer.beta2 must be in [0, 1), got 1.0",
    ),
    # datasets and models
    (["dataset.batch_size=0"], "dataset.batch_size must be >= 1, got 0"),
    (
        ["dataset.sharding=foo"],
        "dataset.sharding must be one of auto, disjoint, replicated, dirichlet, got 'foo'",
    ),
    (["dataset=chars", "dataset.context=1"], "dataset.context must be >= 2, got 1"),
    (
        ["dataset=chars", "dataset.val_fraction=0"],
        "dataset.val_fraction must be in (0, 1), got 0.0",
    ),
    (["dataset=chars", "dataset.corpus_chars=10"], "dataset.corpus_chars must be >= 1000, got 10"),
    (["dataset=mnist1d", "dataset.num_samples=10"], "dataset.num_samples must be >= 20, got 10"),
    (
        ["dataset=mnist1d", "dataset.train_split=1"],
        "dataset.train_split must be in (0, 1), got 1.0",
    ),
    (
        ["dataset=regression", "dataset.conditioning=0.5"],
        "dataset.conditioning must be >= 1, got 0.5",
    ),
    (["model.hidden=[0]"], "model.hidden widths must be >= 1, got [0]"),
    (["model=cnn", "model.channels=[]"], "model.channels must be non-empty, all >= 1, got []"),
    (["model=cnn", "model.kernel_size=2"], "model.kernel_size must be odd and >= 1, got 2"),
    # engines (checked by experiment.prepare, after the data are loaded)
    (
        ["engine=allreduce", "algorithm=asp"],
        "engine=allreduce is synchronous: algorithm.barrier must be one of bsp, got 'asp'",
    ),
    (
        ["runtime=sim", "cluster.compute_ms=0"],
        "runtime=sim needs a step time: set cluster.compute_ms > 0 (virtual ms per step)",
    ),
    (
        ["engine=pipeline", "algorithm=ssp"],
        "engine=pipeline needs algorithm.pipeline, which algorithm=ssp does not set (it sets "
        "algorithm.barrier, algorithm.update): choose a preset made for engine=pipeline, or "
        "another engine",
    ),
    (
        [*PIPE, "cluster.push_latency_ms=5"],
        "cluster.push_latency_ms=5.0: engine=pipeline does not model this; leave it unset "
        "(cluster=homogeneous)",
    ),
    (
        [*PIPE, "dataset.batch_size=30"],
        "dataset.batch_size=30 must be a multiple of algorithm.pipeline.microbatches=4",
    ),
    (
        [*PIPE, "eval.every_updates=0"],
        "eval.every_updates=0: engine=pipeline snapshots every stage at the same step, so it "
        "needs eval.every_updates >= 1 (eval.every_s is not used)",
    ),
    (
        [*PIPE, "dataset=synthetic"],
        "engine=pipeline trains a language model: dataset=synthetic gives inputs of shape (20,), "
        "not token sequences",
    ),
    (
        [*PIPE, "dataset.batch_size=4000000"],
        "dataset.batch_size=4000000 exceeds the 5624 training sequences",
    ),
    (
        ["algorithm=gpipe", "dataset=chars", "model=mlp"],
        "engine=pipeline cuts a model into [embedding, blocks..., head] stages; model=mlp is not "
        "built that way (use model=transformer)",
    ),
    (
        ["algorithm=bsp", "algorithm/update=gap_aware"],
        "algorithm.update=gap_aware keeps per-worker state and cannot take a round's averaged "
        "gradient (algorithm.barrier.apply=per_round); use a barrier that applies per arrival",
    ),
    (
        ["dataset.num_train=100", "dataset.batch_size=200"],
        "dataset.batch_size=200 exceeds the 100 training samples",
    ),
    (
        ["dataset.sharding=disjoint", "dataset.batch_size=1500"],
        "dataset.batch_size=1500 exceeds a worker's shard of 1000 samples (4000 training samples "
        "over cluster.num_workers=4); dataset.sharding=replicated lets every worker sample the "
        "whole split",
    ),
    # dataset.sharding=dirichlet
    (["dataset.dirichlet_alpha=0"], "dataset.dirichlet_alpha must be > 0, got 0.0"),
    (
        ["dataset.sharding=dirichlet", "dataset.dirichlet_alpha=0.01", "dataset.batch_size=64"],
        "dataset.dirichlet_alpha=0.01 leaves worker 2 0 samples, less than "
        "dataset.batch_size=64: raise the concentration, or lower the batch size or "
        "cluster.num_workers",
    ),
    (
        ["dataset=regression", "dataset.sharding=dirichlet"],
        "dataset.sharding=dirichlet splits by class label: the dataset's targets are floats, "
        "not one label per sample",
    ),
    (
        [*PIPE, "dataset.sharding=dirichlet"],
        "dataset.sharding=dirichlet: engine=pipeline feeds one stream of microbatches over the "
        "whole split to its stages; there are no per-worker shards to skew",
    ),
    # engine=local
    (
        ["algorithm=diloco", "engine.mode=gossip"],
        "engine.mode must be one of sync, streaming, overlap, async, got 'gossip'",
    ),
    (["algorithm=streaming_diloco", "engine.fragments=0"], "engine.fragments must be >= 1, got 0"),
    (
        ["algorithm=diloco", "engine.dynamic_local=true"],
        "engine.dynamic_local=True is a setting of engine.mode=async, not of engine.mode=sync",
    ),
    (["algorithm=diloco", "algorithm.outer.delay=0"], "algorithm.outer.delay must be >= 1, got 0"),
    (
        ["algorithm=sgp", "algorithm.inner.lr_decay=linear"],
        "algorithm.inner.lr_decay must be one of none, inverse_sqrt, cosine, got 'linear'",
    ),
    (
        ["algorithm=sgp", "algorithm.inner.lr_decay=cosine"],
        "algorithm.inner.lr_decay_steps must be > 0 with a decay and 0 with lr_decay=none (it "
        "is cosine), got 0",
    ),
    (
        ["algorithm=diloco", "algorithm.inner.lr_decay_steps=100"],
        "algorithm.inner.lr_decay_steps must be > 0 with a decay and 0 with lr_decay=none (it "
        "is none), got 100",
    ),
    (
        [
            "algorithm=local_sgd",
            "algorithm.inner.lr_decay=inverse_sqrt",
            "algorithm.inner.lr_decay_steps=-5",
        ],
        "algorithm.inner.lr_decay_steps must be > 0 with a decay and 0 with lr_decay=none (it "
        "is inverse_sqrt), got -5",
    ),
    (["algorithm=streaming_diloco", "engine.delay=-1"], "engine.delay must be >= 0, got -1"),
    (["algorithm=streaming_diloco", "engine.alpha=2"], "engine.alpha must be in [0, 1], got 2.0"),
    (
        ["algorithm=diloco", "engine.fragments=2"],
        "engine.fragments=2 is a setting of engine.mode=streaming, not of engine.mode=sync",
    ),
    (
        ["algorithm=streaming_diloco", "algorithm.outer.inner_steps=7"],
        "engine.fragments=2, engine.delay=5 with algorithm.outer.inner_steps=7: the fragments "
        "must divide H and a fragment's merge come no later than the next fragment's send "
        "(delay <= H/fragments = 3)",
    ),
    (
        ["algorithm=lsgd", "engine.mode=overlap"],
        "engine.mode=overlap: algorithm.outer=leader picks leaders from the round's losses "
        "before it sends; it runs with engine.mode=sync only",
    ),
    (
        ["algorithm=diloco", "engine.quantize=int4"],
        "engine.quantize must be one of none, fp16, int8, got 'int4'",
    ),
    (
        ["algorithm=lsgd", "engine.quantize=int8"],
        "engine.quantize=int8: algorithm.outer=leader sends only its leaders' Δ, which an "
        "all-gather of every worker's piece would not carry; use none or fp16",
    ),
    (
        ["algorithm=easgd", "algorithm.outer.alpha=0.5"],
        "algorithm.outer.alpha=0.5 with cluster.num_workers=4: the centre moves by N·α = 2 > 1 "
        "of the replicas' spread and overshoots; use alpha <= 0.25 (0 = 0.9/N)",
    ),
    (
        ["algorithm=lsgd", "algorithm.outer.groups=5"],
        "algorithm.outer.groups=5 exceeds cluster.num_workers=4: every group needs a worker",
    ),
    (
        ["algorithm=ssp", "engine=local"],
        "engine=local needs algorithm.outer, which algorithm=ssp does not set (it sets "
        "algorithm.barrier, algorithm.update): choose a preset made for engine=local, or "
        "another engine",
    ),
    (
        ["algorithm=diloco", "engine=ps"],
        "engine=ps needs algorithm.barrier, which algorithm=diloco does not set (it sets "
        "algorithm.inner, algorithm.outer): choose a preset made for engine=ps, or another "
        "engine",
    ),
    (["engine=allreduce", "engine.bucket_mb=-1"], "engine.bucket_mb must be >= 0, got -1.0"),
    (
        ["engine=allreduce", "engine.schedule=lifo"],
        "engine.schedule must be one of fifo, p3, got 'lifo'",
    ),
    (
        ["engine=allreduce", "algorithm=bsp", "engine.schedule=p3"],
        "engine.schedule=p3 sends θ in slices of engine.bucket_mb: set it > 0 (P3's slices "
        "are a few hundred kB)",
    ),
    (
        [
            "engine=allreduce",
            "algorithm=bsp",
            "algorithm/update=staleness_aware",
            "engine.bucket_mb=1",
            "engine.schedule=p3",
        ],
        "engine.schedule=p3 applies each slice as it arrives, which needs an element-wise "
        "rule: algorithm.update=staleness_aware is not (use one of momentum, sgd)",
    ),
    # the update rules that are torch's optimizers (stalebench/algorithms/torch_optim.py)
    (
        [
            "engine=allreduce",
            "algorithm=bsp",
            "algorithm/update=adamw",
            "engine.bucket_mb=1",
            "engine.schedule=p3",
        ],
        "engine.schedule=p3 applies each slice as it arrives, which needs an element-wise "
        "rule: algorithm.update=adamw is not (use one of momentum, sgd)",
    ),
    (
        ["algorithm/update=adam", "algorithm.update.beta1=1"],
        "algorithm.update.beta1 must be in [0, 1), got 1.0",
    ),
    (
        ["algorithm/update=adamw", "algorithm.update.beta2=-0.5"],
        "algorithm.update.beta2 must be in [0, 1), got -0.5",
    ),
    (
        ["algorithm/update=nadam", "algorithm.update.eps=0"],
        "algorithm.update.eps must be > 0, got 0.0",
    ),
    (
        ["algorithm/update=adamw", "algorithm.update.lr=0"],
        "algorithm.update.lr must be > 0, got 0.0",
    ),
    (
        ["algorithm/update=nadam", "algorithm.update.momentum_decay=-1"],
        "algorithm.update.momentum_decay must be >= 0, got -1.0",
    ),
    (
        ["algorithm/update=torch_sgd", "algorithm.update.dampening=2"],
        "algorithm.update.dampening must be in [0, 1], got 2.0",
    ),
    (
        ["algorithm/update=torch_sgd", "algorithm.update.nesterov=true"],
        "algorithm.update.nesterov=True needs algorithm.update.momentum > 0 and dampening = 0 "
        "(torch's rule), got momentum=0.0, dampening=0.0",
    ),
    (
        ["algorithm=local_sgd", "dataset.sharding=disjoint", "dataset.batch_size=1500"],
        "dataset.batch_size=1500 exceeds a worker's shard of 1000 samples (4000 training samples "
        "over cluster.num_workers=4); dataset.sharding=replicated lets every worker sample the "
        "whole split",
    ),
    # the gathering barriers' and the gossip engine's checks (previously run only by
    # integration tests)
    (
        ["algorithm=bsp_backup", "algorithm.barrier.backups=-1"],
        "algorithm.barrier.backups must be >= 0, got -1",
    ),
    (
        ["algorithm=dbs", "algorithm.barrier.rebalance_every=-1"],
        "algorithm.barrier.rebalance_every must be >= 0, got -1",
    ),
    (
        ["algorithm=gba", "algorithm.barrier.threshold=-1"],
        "algorithm.barrier.threshold must be >= 0, got -1",
    ),
    (
        ["engine=allreduce", "algorithm=bsp_backup"],
        "algorithm.barrier=bsp with backups=1 needs each gradient on its own as it arrives (a "
        "server), which engine=allreduce does not give: use engine=ps, or leave "
        "algorithm.barrier.backups at its default",
    ),
    (
        ["engine=allreduce", "algorithm=dbs"],
        "algorithm.barrier=bsp with rebalance_every=10 needs each gradient weighed by the size "
        "of its minibatch (a server), which engine=allreduce does not give: use engine=ps, or "
        "leave algorithm.barrier.rebalance_every at its default",
    ),
    (
        ["algorithm=sgp", "algorithm.inner.reset=true"],
        "algorithm.inner=momentum with reset=true needs rounds to reset the local optimizer at, "
        "which engine=gossip does not give: use engine=local, or leave algorithm.inner.reset at "
        "its default",
    ),
    (["algorithm=sgp", "engine.sync_every=0"], "engine.sync_every must be >= 1, got 0"),
    (
        ["algorithm=bsp_backup", "cluster.num_workers=2", "algorithm.barrier.backups=2"],
        "algorithm.barrier.backups=2 with cluster.num_workers=2: a round needs at least one "
        "gradient (backups <= 1)",
    ),
    (
        [
            "algorithm=dbs",
            "dataset=synthetic",
            "dataset.sharding=disjoint",
            "cluster.num_workers=8",
            "dataset.batch_size=64",
        ],
        "algorithm.barrier.rebalance_every=10 may give a worker up to the global batch of 512 "
        "samples, more than its shard of about 500 (dataset.sharding=disjoint): use "
        "dataset.sharding=replicated, or fewer workers",
    ),
]


def test_a_shared_composition_is_hydras_own():
    """The suite's shared composition (tests/conftest.py's ChoicesComposedOnce, which the
    cases go through) gives the config Hydra's own compose gives, for cases of each kind:
    value overrides only, swapped groups with values set in them, a group of a group
    (algorithm/update), an appended sweep whose values reach the run through
    interpolations, a list of typed faults."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from stalebench.config import register_configs
    from stalebench.plugins import load as load_plugins

    picked = [
        ["budget.max_updates=-1"],
        [*PIPE, "dataset.batch_size=30"],
        ["algorithm=bsp", "algorithm/update=gap_aware"],
        ["algorithm=streaming_diloco", "algorithm.outer.inner_steps=7"],
        ["+sweep=sync_bends", "+sweep/arms/sync_bends=dbs_disturbed", "sweep.params.disturbance=5"],
        ["cluster.faults=[{worker:1,at_step:5,action:slow_compute,factor:3,duration_steps:-1}]"],
        ["dataset.sharding=dirichlet", "dataset.dirichlet_alpha=0.01", "dataset.batch_size=64"],
    ]
    assert all(any(o == c for c, _ in CASES) for o in picked)
    assert isinstance(hydra.compose, ChoicesComposedOnce)  # which the cases go through
    hydras_own = hydra.compose.hydra_compose
    load_plugins()  # the ConfigStore as compose_run fills it
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module("stalebench.conf", version_base=None):
            for overrides in (fast_with(["budget.max_updates=5", *o]) for o in picked):
                assert _choices_and_values(overrides) is not None, overrides
                theirs = hydras_own("config", overrides=overrides)
                for _ in range(2):  # the choices composed (or found composed), then found
                    mine = hydra.compose("config", overrides=overrides)
                    assert OmegaConf.to_container(mine) == OmegaConf.to_container(theirs)
                    assert OmegaConf.to_yaml(mine) == OmegaConf.to_yaml(theirs), overrides
                    assert OmegaConf.is_struct(mine) and OmegaConf.is_struct(theirs)
    finally:
        GlobalHydra.instance().clear()


@pytest.mark.parametrize("overrides, message", CASES, ids=[" ".join(o) for o, _ in CASES])
def test_bad_input_is_refused_before_any_process_naming_the_key(tmp_path, overrides, message):
    with pytest.raises(ConfigError) as err:
        cfg = compose(fast_with(["budget.max_updates=5", *overrides]))
        cfg.run_dir = str(tmp_path / "run")
        experiment.prepare(cfg)
    assert str(err.value) == message
    assert not (tmp_path / "run").exists()  # nothing started, nothing written


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "worker,ms\n0,10\n1,abc\n",
            "line 3: worker,ms must be an integer and a number, got '1','abc'",
        ),
        ("worker,ms\n0,-1\n", "has no rows or negative times"),
        ("worker,ms\n", "has no rows or negative times"),
        ("step,ms\n0,10\n", "needs the columns worker,ms"),
    ],
)
def test_a_bad_trace_file_is_refused_naming_the_key(tmp_path, text, message):
    trace = tmp_path / "trace.csv"
    trace.write_text(text)
    cfg = compose(
        fast_with(["budget.max_updates=5", "cluster.compute=trace", f"cluster.trace_file={trace}"])
    )
    cfg.run_dir = str(tmp_path / "run")
    # the file named as given (its path, quoted), then what is wrong with it
    with pytest.raises(
        ConfigError, match=re.escape(f"cluster.trace_file: {str(trace)!r} {message}")
    ):
        experiment.prepare(cfg)
    assert not (tmp_path / "run").exists()


def test_an_unknown_name_in_a_group_override_is_named_before_composition():
    from stalebench.cli import check_choices

    with pytest.raises(ConfigError, match=re.escape("algorithm/barrier: unknown 'nope'")):
        check_choices(["-m", "algorithm/barrier=ssp,nope"])


def test_an_unknown_registered_name_lists_the_registered_ones():
    from stalebench.algorithms.base import BARRIERS

    with pytest.raises(
        ConfigError, match=r"algorithm\.barrier\.name: unknown barrier 'nope'; registered: asp, bsp"
    ):
        BARRIERS.get("nope")


def test_an_engine_refuses_a_runtime_it_does_not_run_in():
    from stalebench.engines.ps import ParameterServerEngine

    class SimOnly(ParameterServerEngine):
        runtimes = ("sim",)

    cfg = compose(fast_with(["budget.max_updates=5"]))
    engine = SimOnly(cfg.engine, cfg)
    with pytest.raises(ConfigError, match=re.escape("runtime=real: engine=ps runs in sim")):
        engine.validate(None)


def test_a_process_count_the_machine_cannot_hold_is_refused(monkeypatch):
    monkeypatch.setattr(experiment, "_available_mb", lambda: 1000)  # room for 3 ranks
    cfg = compose(fast_with(["budget.max_updates=5", "cluster.num_workers=3"]))
    with pytest.raises(ConfigError) as err:
        experiment.prepare(cfg)  # a server and 3 workers: 4 processes
    assert str(err.value) == (
        "cluster.num_workers=3 needs 4 processes here (engine=ps), about 1024 MB, but 1000 MB "
        "is available (runtime=sim runs any number of workers in one process)"
    )
    cfg = compose(fast_with(["budget.max_updates=5", "cluster.num_workers=2"]))
    experiment.prepare(cfg)  # 3 processes fit
    experiment.prepare(
        compose(fast_with(["budget.max_updates=5", "runtime=sim", "cluster.num_workers=50"]))
    )


def test_the_machine_s_available_memory_is_read():
    assert experiment._available_mb() > experiment.RANK_MB


def test_a_run_without_a_directory_is_refused():
    cfg = compose(fast_with(["budget.max_updates=5"]))
    cfg.run_dir = ""
    with pytest.raises(ConfigError, match="run_dir is empty"):
        experiment.launch(cfg)


@pytest.mark.parametrize("model", ["gamma", "lognormal"])
def test_a_random_step_time_below_one_ms_is_accepted(model):
    cfg = compose(
        fast_with(["budget.max_updates=5", f"cluster.compute={model}", "cluster.compute_ms=0.5"])
    )
    assert (cfg.cluster.compute, cfg.cluster.compute_ms) == (model, 0.5)


@pytest.mark.parametrize(
    "overrides",
    [
        ["cluster.compute=lognormal", "cluster.lognormal_sigma=0"],  # a constant step
        ["cluster.slow_fraction=1", "cluster.slow_factor=3"],  # every worker slow
        ["cluster.slow_factor=2", "cluster.slow_factor_max=2"],
        ["cluster.straggler_prob=1", "cluster.straggler_factor=1.5"],
        ["cluster.straggler_prob=0.5", "cluster.straggler_factor=1"],
        ["cluster.faults=[{worker:1,at_s:0,action:pause,duration_s:0}]"],
        ["cluster.faults=[{worker:1,at_s:0.5,action:die}]"],
        ["cluster.faults=[{worker:1,at_step:0,action:die}]"],  # at its first step
        # slowed from the first step, for one step; barely slower
        ["cluster.faults=[{worker:1,at_step:0,action:slow_compute,factor:3,duration_steps:1}]"],
        ["cluster.faults=[{worker:0,at_step:2,action:slow_compute,factor:1.001}]"],
    ],
    ids=str,
)
def test_the_bounds_of_each_cluster_range_are_accepted(overrides):
    cfg = compose(fast_with(["budget.max_updates=5", "cluster.num_workers=2", *overrides]))
    for key, value in (o.split("=", 1) for o in overrides):
        if key not in ("cluster.faults", "cluster.compute"):
            assert float(getattr(cfg.cluster, key.split(".")[1])) == float(value)
    assert len(cfg.cluster.faults) == sum(o.startswith("cluster.faults") for o in overrides)


def test_cuda_asked_for_where_there_is_none_is_refused():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    cfg = compose(fast_with(["budget.max_updates=5", "device=cuda"]))
    with pytest.raises(ConfigError, match=re.escape("device=cuda but CUDA is not available here")):
        experiment.prepare(cfg)


CLAIM = {
    "id": "c",
    "origin": "paper",
    "metric": "final_accuracy",
    "margin": 0.0,
    "better": "lower",
    "a": {"algorithm": "ssp"},
    "b": {"algorithm": "bsp"},
}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"id": ""}, "claim.id must be a non-empty name, got ''"),
        ({"kind": "foo"}, "claim.kind must be one of"),
        ({"better": "sideways"}, "claim.better must be one of lower, higher, got 'sideways'"),
        ({"metric": ""}, "claim.metric must be a run metric for kind=ordering, got ''"),
        ({"a": {}}, "claim.a must be a run selector"),
        ({"b": {}}, "claim.b must be a run selector for kind=ordering"),
        ({"kind": "gap_closed", "c": {}}, "claim.c must be a run selector for kind=gap_closed"),
        ({"kind": "trend"}, "claim.over must be a key (e.g. num_workers) for kind=trend, got ''"),
        (
            {"metric": "time_to_target"},
            "claim.target must be {split, key, value} for metric=time_to_target, got None",
        ),
        (
            {"metric": "time_to_target", "target": {"split": "test", "key": "f1", "value": 0.5}},
            "claim.target.key must be one of",
        ),
        (
            {
                "metric": "time_to_target",
                "better": "higher",
                "target": {"split": "test", "key": "accuracy", "value": 0.5},
            },
            "claim.better must be lower for metric=time_to_target",
        ),
        ({"colour": "red"}, "claim: unknown keys ['colour']"),
        ({"origin": ""}, "claim.origin must be one of paper, recalled, self-check, got ''"),
        ({"threshold_from": "x"}, "claim.threshold_from must be one of paper, ours, got 'x'"),
        ({"margin": -1}, "claim.margin must be >= 0, got -1"),
        ({"min_seeds": 1}, "claim.min_seeds must be >= 2 (a test needs two seeds), got 1"),
    ],
)
def test_a_bad_claim_is_refused_naming_the_key(change, message):
    from stalebench.sweep import claim_from_dict

    with pytest.raises(ConfigError, match=re.escape(message)):
        claim_from_dict({**CLAIM, **change})


def test_a_sweep_with_a_bad_scale_or_a_claim_used_twice_is_refused():
    from stalebench.sweep import SweepConfig, claim_from_dict

    with pytest.raises(
        ConfigError, match=re.escape("sweep.scale must be one of small, full, got 'huge'")
    ):
        SweepConfig(scale="huge")
    claim = claim_from_dict(CLAIM)
    with pytest.raises(ConfigError, match=re.escape("sweep.claims[1].id 'c' is used twice")):
        SweepConfig(claims=[claim, claim])


def test_a_transformer_refuses_inputs_that_are_not_token_sequences():
    from stalebench.models import MODELS
    from stalebench.registry import ComponentConfig

    _, config = MODELS.get("transformer")
    assert issubclass(config, ComponentConfig)
    with pytest.raises(
        ConfigError, match=re.escape("model=transformer needs token sequences, got shape (28, 28)")
    ):
        MODELS.build(config(name="transformer"), (28, 28), 10)
