"""Cost-only simulation (`sim.numerics=false`): an engine's protocol and the clock at the
model's real sizes and step times, with no value computed. A cost-only run is the run with
values less its values: the same events, field for field, but for the losses and the
evaluations, which it does not have (never zeros in their place); a paper-sized model
(ResNet-50 on ImageNet's shapes) is built on the meta device and costs what its bytes and
FLOPs say, without memory; what cannot run without values is refused by key and value (an
engine that does not declare `cost_only`: test_engine_own_kind.py's plugin)."""

from __future__ import annotations

import pytest

from stalebench import experiment
from stalebench.errors import ConfigError
from stalebench.metrics.events import schema_errors
from stalebench.metrics.summary import NUMERIC_KEYS
from tests.conftest import compose, fast_with, run_job
from tests.unit.test_pipeline_rules import SMALL

pytestmark = pytest.mark.timeout(120)

# 4 ranks of unequal speed on a slow network (every message priced), a CNN on MNIST-1D
BASE = [
    "runtime=sim", "model=cnn", "dataset=mnist1d", "cluster=slow_network",
    "cluster.num_workers=4", "cluster.compute=gamma", "cluster.gamma_shape=4",
    "budget.max_wall_s=3", "eval.every_s=0.5",
]  # fmt: skip
ALLREDUCE = ["engine=allreduce", "algorithm=bsp"]
H10 = "algorithm.outer.inner_steps=10"  # DiLoCo's 50 would leave 3 s a few rounds
LOSS = ["cluster.min_replicas=3", "cluster.faults=[{worker:2,at_s:1.2,action:die}]"]
CASES = {
    "allreduce": ALLREDUCE,
    "allreduce-buckets": [*ALLREDUCE, "engine.bucket_mb=0.01"],
    "allreduce-p3": [*ALLREDUCE, "engine.bucket_mb=0.01", "engine.schedule=p3"],
    "allreduce-a-replica-lost": [*ALLREDUCE, *LOSS],
    "sgp": ["algorithm=sgp"],
    "osgp-overlap": ["algorithm=osgp"],
    "dpsgd-mixes-first": ["algorithm=dpsgd"],
    "sgp-a-node-lost": ["algorithm=sgp", *LOSS],
    "ps-asp": ["algorithm=asp"],
    "ps-ssp": ["algorithm=ssp"],
    "ps-bsp-rounds": ["algorithm=bsp"],
    "ps-backups-gathering": ["algorithm=bsp_backup"],
    "ps-dana-worker-side": ["algorithm=dana"],
    "ps-a-worker-lost": ["algorithm=asp", "cluster.faults=[{worker:2,at_s:1.2,action:die}]"],
    "local-sgd": ["algorithm=local_sgd"],
    "local-diloco-int8-gathered": ["algorithm=diloco", H10, "engine.quantize=int8"],
    "local-leaders": ["algorithm=lsgd"],
    "local-streaming-delayed": ["algorithm=streaming_diloco", H10, "engine.delay=2"],
    "local-overlap": ["algorithm=hpsgd"],
    "local-a-replica-lost": ["algorithm=diloco", H10, *LOSS],
    "local-async-dynamic": [
        "algorithm=local_sgd",
        "engine.mode=async",
        "engine.dynamic_local=true",
    ],
    "pipeline-1f1b-stashed": ["algorithm=pipedream"],
    "pipeline-gpipe-flushed": ["algorithm=gpipe"],
    "pipeline-nesterov": ["algorithm=nesterov_pp"],
}
# the pipeline's own: a char-level decoder on text, 4 stages of unequal speed, on a network
# its clock does not model
PIPELINE = [
    "runtime=sim", "model=transformer", "dataset=chars", *SMALL, "cluster.compute=gamma",
    "cluster.gamma_shape=4", "budget.max_updates=40",
]  # fmt: skip
# in events other than `eval`: the losses, gossip's distances, a local round's ‖Δ‖ and the
# wire's error, a pipeline stage's gradient norm and distance from its forward's weights
NUMERIC_FIELDS = {"loss", "consensus", "delta_norm", "wire_error", "weight_gap", "grad_norm"}


def without_values(events: list[dict]) -> list[dict]:
    """The events a run with values shares with a cost-only one: no evaluations, no losses
    or distances, the start event without `numerics`."""
    drop = NUMERIC_FIELDS | {"numerics"}
    return [{k: v for k, v in e.items() if k not in drop} for e in events if e["kind"] != "eval"]


@pytest.mark.parametrize("case", list(CASES))
def test_a_cost_only_run_is_the_run_with_values_less_its_values(tmp_path, case):
    overrides = [*(PIPELINE if case.startswith("pipeline") else BASE), *CASES[case]]
    numeric = run_job(tmp_path / "values", fast_with(overrides))
    cost = run_job(tmp_path / "cost", fast_with([*overrides, "sim.numerics=false"]))
    assert numeric.summary["status"] == cost.summary["status"] == "completed"
    assert any(e["kind"] == "eval" for e in numeric.events)  # what the cost-only run lacks
    assert without_values(cost.events) == without_values(numeric.events)
    assert cost.events[0]["numerics"] is False and "numerics" not in numeric.events[0]
    assert not any(NUMERIC_FIELDS & set(e) or e["kind"] == "eval" for e in cost.events)
    assert not [e for e in cost.events if schema_errors(e, values=False)]
    # what needs values is absent from summary.json, never zero; the rest is equal
    s, n = cost.summary, numeric.summary
    assert s["numerics"] is False and not set(NUMERIC_KEYS) & set(s)
    same = set(n) - set(NUMERIC_KEYS) - {"host", "config_sha", "sim_loop_s", "chance_accuracy"}
    same -= {"consensus_final"}  # gossip's distances between the nodes: values
    same -= {"ranks"}  # where each rank computed: a cost-only run's on the meta device
    assert {r["device"] for r in s["ranks"]} == {"meta"}
    assert {k: s.get(k) for k in same} == {k: n[k] for k in same}
    assert s["updates"] >= 10 and s["bytes_sent"] > 0  # rounds (local: of H inner steps)
    lost = LOSS[0] in CASES[case] or case == "ps-a-worker-lost"
    assert s["workers_lost"] == ([2] if lost else [])
    assert not (cost.dir / "model.pt").exists() and (cost.dir / "metrics.parquet").exists()


def test_a_paper_sized_model_costs_its_bytes_and_flops_without_memory(tmp_path):
    """ResNet-50 (25,557,032 parameters) on ImageNet's shapes over 32 replicas and 10
    Gbit/s links: each round is the step the FLOPs give, then a ring all-reduce of the whole
    gradient and the round's tail, to the byte."""
    from stalebench.engines.rounds import ring_volume, round_bytes
    from stalebench.runtime.network import Network

    n, rounds = 32, 12
    run = run_job(tmp_path, fast_with([
        "runtime=sim", "engine=allreduce", "algorithm=bsp", "model=resnet50", "dataset=shape",
        "dataset.batch_size=32", "cluster=homogeneous", f"cluster.num_workers={n}",
        "cluster.device=v100", "cluster.push_bandwidth_gbps=10", "cluster.pull_bandwidth_gbps=10",
        f"budget.max_updates={rounds}", "sim.numerics=false",
    ]))  # fmt: skip
    s = run.summary
    assert s["status"] == "completed", s["error"]
    message = round_bytes(25_557_032, n)
    assert s["updates"] == rounds and s["bytes_sent"] == rounds * ring_volume(message, n)
    cfg = compose(
        fast_with(
            [
                "runtime=sim",
                "cluster.push_bandwidth_gbps=10",
                "cluster.pull_bandwidth_gbps=10",
                f"cluster.num_workers={n}",
                "budget.max_updates=1",
            ]
        )
    )
    ring_s = Network(cfg.cluster).allreduce_s(message, 0.0)
    assert ring_s > 0.1  # 102 MB around a ring of 32 at 10 Gbit/s
    step_s = s["compute"]["compute_ms"] / 1000  # 777.6 GFLOPs at 40 % of a V100's fp32 peak
    assert 0.12 < step_s < 0.13
    assert s["run_time_s"] == pytest.approx(rounds * (step_s + ring_s), abs=1e-6)  # t: µs


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (
            ["runtime=real", "engine=allreduce", "algorithm=bsp", "sim.numerics=false"],
            "sim.numerics=false runs in runtime=sim only",
        ),
        (
            ["runtime=sim", "engine=allreduce", "algorithm=bsp", "dataset=shape", "model=mlp"],
            "dataset=shape holds shapes without values: it runs only cost-only",
        ),
        (
            [
                "runtime=sim",
                "engine=allreduce",
                "algorithm=bsp",
                "sim.numerics=false",
                "checkpoint_every_s=1",
            ],
            "checkpoint_every_s=1: a cost-only run",
        ),
    ],
    ids=["real", "shapes-with-numerics", "checkpoints"],
)
def test_what_needs_values_is_refused_by_key_before_any_process(overrides, says):
    cfg = compose(fast_with([*overrides, "budget.max_updates=5"]))
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)")):
        experiment.prepare(cfg)


@pytest.mark.timeout(240)
def test_p3_at_resnet50_outruns_its_baseline_on_a_slow_link(tmp_path):
    """P3's sweep arms at ResNet-50's tensors and per-layer FLOPs on 4 P4000s over 2 Gbit/s
    (a round's ring all-reduce longer than its backward pass): the baseline's next forward
    waits for the first layer's gradient, sent last; P3's sends it first and overlaps the
    rest with the forward pass, so it makes more rounds a second, of the same bytes."""
    common = [
        "+sweep/arms/p3_model=resnet50", "model=resnet50", "dataset=shape",  # past FAST's
        "+sweep.params.lr=0.1", "runtime=sim",
        "sim.numerics=false", "dataset.batch_size=32", "cluster=homogeneous",
        "cluster.num_workers=4", "cluster.device=p4000", "cluster.push_bandwidth_gbps=2",
        "cluster.pull_bandwidth_gbps=2", "budget.max_updates=8", "budget.max_wall_s=0",
    ]  # fmt: skip
    base = run_job(tmp_path / "base", ["+sweep/arms/p3=baseline", *common])
    p3 = run_job(tmp_path / "p3", ["+sweep/arms/p3=p3", *common])
    for run in (base, p3):
        assert run.summary["status"] == "completed", run.summary["error"]
    assert base.summary["bytes_sent"] == p3.summary["bytes_sent"] > 0
    gain = p3.summary["throughput_updates_per_s"] / base.summary["throughput_updates_per_s"]
    assert gain > 1.1


@pytest.mark.timeout(120)
def test_a_translation_model_runs_cost_only_on_token_shapes(tmp_path):
    """dataset=shape with tokens=true: Sockeye's model (27,734,558 parameters at P3's
    vocabularies) on sequences of token ids, without values; each round moves its bytes."""
    from stalebench.engines.rounds import ring_volume, round_bytes

    run = run_job(tmp_path, [
        "+sweep/arms/p3_model=sockeye", "model=sockeye_rnn", "dataset=shape", "runtime=sim",
        "sim.numerics=false",
        "engine=allreduce", "algorithm=bsp", "cluster=homogeneous", "cluster.num_workers=2",
        "cluster.device=v100", "dataset.batch_size=8", "budget.max_updates=3",
        "budget.max_wall_s=0",
    ])  # fmt: skip
    s = run.summary
    assert s["status"] == "completed", s["error"]
    assert s["bytes_sent"] == 3 * ring_volume(round_bytes(27_734_558, 2), 2)
    assert s["compute"]["compute_ms"] > 0  # the LSTMs' FLOPs, counted on the meta device
