"""engine=local against its definitions, in the simulator bit for bit where the algebra is
exact and to float rounding where it is not, and in real processes: the invariants
(H = 1 averaging is BSP, one worker is plain training, Nesterov without momentum is
averaging), faults (a paused worker stalls a synchronous round), and the simulator and the
real runtime agreeing on step rates and bytes."""

from __future__ import annotations

import statistics

import pytest
import torch

from stalebench.job import Job
from stalebench.runtime.launch import OVERRUN_LIMIT
from tests.conftest import compose, fast_with, run_job
from tests.speed_helpers import fork_server_for_every_engine

SIM = ["runtime=sim", "cluster.num_workers=4", "budget.max_updates=12"]


@pytest.fixture(scope="module")
def one_fork_server():
    """The ranks of the real runs here forked from a server loaded for every engine: one
    started before in this process, or one started at the first real test here (not while
    the simulated runs before it compute) that later modules' runs, of any engine, fork
    from too."""
    import stalebench.experiment  # noqa: F401  (registers the engines the server loads)

    fork_server_for_every_engine()


def sim(tmp_path, name, *overrides):
    return run_job(tmp_path / name, [*SIM, *overrides])


def weights(run) -> dict[str, torch.Tensor]:
    return torch.load(run.dir / "model.pt")


def updates(run):
    return [e for e in run.events if e["kind"] == "update"]


@pytest.mark.timeout(60)
def test_one_inner_step_of_sgd_then_averaging_is_bsp(tmp_path):
    local = sim(
        tmp_path, "local", "algorithm=local_sgd", "algorithm.outer.inner_steps=1",
        "algorithm.inner.lr=0.1",
    )  # fmt: skip
    bsp = sim(tmp_path, "bsp", "algorithm=bsp", "engine=allreduce", "algorithm.update.lr=0.1")
    assert local.summary["updates"] == bsp.summary["updates"] == 12
    a, b = weights(local), weights(bsp)
    for key in a:
        # θ − mean(θ − (θ − ηg_i)) and θ − η·mean(g_i) differ by float rounding only
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)
    assert [e["loss"] for e in updates(local)] == pytest.approx(
        [e["loss"] for e in updates(bsp)], rel=1e-4
    )


@pytest.mark.timeout(60)
def test_one_worker_is_plain_training(tmp_path):
    overrides = [
        "algorithm=diloco", "algorithm/outer=average", "algorithm.outer.inner_steps=5",
        "algorithm.inner.lr=0.01", "cluster.num_workers=1", "budget.max_updates=4",
    ]  # fmt: skip
    run = run_job(tmp_path / "local", ["runtime=sim", *overrides])
    # the reference: the model trained by torch's AdamW on worker 0's stream, 4·5 steps
    job = Job.build(compose(fast_with(overrides)))
    model, batches = job.model(), job.batches(0)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.9, 0.95), weight_decay=0.1)
    for _ in range(20):
        x, y = next(batches)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    got = weights(run)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(got[key], value, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(60)
def test_nesterov_without_momentum_at_unit_lr_is_averaging_bit_for_bit(tmp_path):
    common = ["algorithm.outer.inner_steps=3", "algorithm.name=x"]
    avg = sim(tmp_path, "avg", "algorithm=diloco", "algorithm/outer=average", *common)
    nest = sim(
        tmp_path, "nest", "algorithm=diloco", "algorithm.outer.momentum=0",
        "algorithm.outer.lr=1", *common,
    )  # fmt: skip
    a, b = weights(avg), weights(nest)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [e["loss"] for e in updates(avg)] == [e["loss"] for e in updates(nest)]


@pytest.mark.timeout(60)
def test_fp16_halves_the_payload_and_measures_its_error(tmp_path):
    full = sim(tmp_path, "full", "algorithm=local_sgd")
    half = sim(tmp_path, "half", "algorithm=local_sgd", "engine.quantize=fp16")
    assert all(e["wire_error"] == 0.0 for e in updates(full))
    errors = [e["wire_error"] for e in updates(half)]
    assert all(0.0 < err < 1e-3 for err in errors), errors[:4]
    d = sum(v.numel() for v in weights(full).values())
    # the statistics are the harness's (free, uncounted): the bytes are the payload's alone
    per_round = 2 * 3  # a ring all-reduce: 2(M − 1) times the message over all workers
    assert full.summary["bytes_sent"] == 12 * per_round * 4 * d
    assert half.summary["bytes_sent"] == 12 * per_round * 2 * d
    assert sum(updates(half)[0]["bytes"] for _ in range(4)) == per_round * 2 * d


@pytest.mark.timeout(60)
def test_a_paused_worker_stalls_the_synchronous_round(tmp_path):
    base = ["algorithm=local_sgd", "cluster.compute_ms=10"]  # a round: 10 steps, 0.1 s
    plain = sim(tmp_path, "plain", *base)
    paused = sim(tmp_path, "paused", *base, "cluster.faults=[{worker:1,at_s:0.25,duration_s:1.0}]")
    ends = lambda run: sorted({e["t"] for e in updates(run)})  # noqa: E731
    assert ends(plain)[:3] == pytest.approx([0.1, 0.2, 0.3])
    # the pause strikes in round 3 (it starts at 0.2 s): every worker's round ends 1 s later
    assert ends(paused)[:3] == pytest.approx([0.1, 0.2, 1.3])
    third = [e for e in updates(paused) if e["version"] == 3]
    assert [e["paused_s"] for e in third] == pytest.approx([0.0, 1.0, 0.0, 0.0])
    assert [e["wait_s"] for e in third] == pytest.approx([1.0, 0.0, 1.0, 1.0])
    pauses = [e for e in paused.events if e["kind"] == "worker" and e["event"] == "pause"]
    assert [(p["worker"], p["duration_s"], p["t"]) for p in pauses] == [
        (1, pytest.approx(1.0), pytest.approx(1.3))
    ]


@pytest.mark.timeout(60)
def test_a_dead_worker_fails_the_simulated_run_with_its_summary(tmp_path):
    run = sim(
        tmp_path, "dead", "algorithm=local_sgd", "cluster.faults=[{worker:2,at_s:0.05,action:die}]"
    )
    assert run.summary["status"] == "failed"
    assert "worker 2 died" in run.summary["error"]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.usefixtures("one_fork_server")
@pytest.mark.parametrize(
    "mode",
    [
        ["algorithm=diloco"],
        ["algorithm=streaming_diloco", "engine.delay=2"],
        ["algorithm=hpsgd", "engine.quantize=fp16"],
        ["algorithm=diloco", "engine.quantize=int8"],
        ["algorithm=async_diloco", "engine.dynamic_local=true", "algorithm.outer.delay=3"],
    ],
    ids=["sync", "streaming", "overlap-fp16", "sync-int8", "async"],
)
def test_the_simulator_and_real_processes_agree_on_step_rates_and_bytes(tmp_path, mode):
    common = [
        *mode, "algorithm.outer.inner_steps=6", "cluster.num_workers=3",
        "cluster.compute_ms=50", "cluster.slowdown=[1,1,2]", "budget.max_updates=6",
        "eval.every_updates=3",
    ]  # fmt: skip
    real = run_job(tmp_path / "real", common)
    simulated = run_job(tmp_path / "sim", ["runtime=sim", *common])
    for run in (real, simulated):
        assert run.summary["status"] == "completed", run.summary["error"]
    assert real.summary["bytes_sent"] == simulated.summary["bytes_sent"] > 0

    def rates(run):
        out = {}
        for e in updates(run):
            steps, seconds = out.get(e["worker"], (0, 0.0))
            out[e["worker"]] = (steps + e["inner_steps"], seconds + e["compute_s"])
        return [steps / seconds for steps, seconds in (out[w] for w in sorted(out))]

    # 20, 20 and 10 steps/s in the profile; the real steps are padded up to it, unless the
    # machine could not keep it (a loaded 2-core CI host: one worker's steps 24 ms against
    # a 20 ms profile), which the run must then say in summary.json
    assert rates(simulated) == pytest.approx([20.0, 20.0, 10.0])
    overrun = real.summary["overrun"]
    if overrun["fraction"] <= OVERRUN_LIMIT:
        assert rates(real) == pytest.approx(rates(simulated), rel=0.15), overrun
    else:  # slower than drawn, never faster
        assert all(r <= s * (1 + 1e-9) for r, s in zip(rates(real), rates(simulated), strict=True))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("engine", ["local", "ps", "allreduce"])
def test_dirichlet_shards_are_recorded_by_every_data_parallel_engine(tmp_path, engine):
    preset = {"local": "algorithm=local_sgd", "ps": "algorithm=asp", "allreduce": "algorithm=bsp"}
    run = sim(
        tmp_path, engine, preset[engine], f"engine={engine}", "dataset.sharding=dirichlet",
        "dataset.dirichlet_alpha=0.3",
    )  # fmt: skip
    assert run.summary["status"] == "completed", run.summary["error"]
    start = run.events[0]
    assert (start["sharding"], start["dirichlet_alpha"]) == ("dirichlet", 0.3)
    assert (run.summary["sharding"], run.summary["dirichlet_alpha"]) == ("dirichlet", 0.3)


@pytest.mark.timeout(60)
def test_the_round_pays_its_payload_on_the_wire_and_the_statistics_ride_free(tmp_path):
    """Every exchange is the payload in the wire's type (a leader rule's losses first), then
    the statistics (float64, so the events and the wall budget read exact values): the
    harness's measurement, which costs no time on the wire and no bytes. The round's
    communication is the algorithm's traffic alone."""
    from stalebench.cluster import ClusterConfig
    from stalebench.runtime.network import Network

    net = ["cluster=slow_network", "algorithm=local_sgd"]
    one = sim(tmp_path, "one", *net)
    two = sim(tmp_path, "two", *net, "engine.quantize=fp16")
    lead = sim(tmp_path, "lead", *net, "algorithm/outer=leader")
    network = Network(
        ClusterConfig(
            preset="x",
            num_workers=4,
            push_latency_ms=5,
            pull_latency_ms=5,
            push_bandwidth_gbps=0.1,
            pull_bandwidth_gbps=0.1,
        )
    )
    d = sum(v.numel() for v in weights(one).values())
    assert updates(one)[0]["comm_s"] == pytest.approx(network.allreduce_s(4 * d))
    assert updates(two)[0]["comm_s"] == pytest.approx(network.allreduce_s(2 * d))
    losses = 8 * 4  # one float64 per worker
    assert updates(lead)[0]["comm_s"] == pytest.approx(
        network.allreduce_s(losses) + network.allreduce_s(4 * d)
    )


@pytest.mark.timeout(60)
def test_streaming_with_one_fragment_and_no_delay_is_sync_bit_for_bit(tmp_path):
    common = ["algorithm=diloco", "algorithm.outer.inner_steps=3", "algorithm.name=x"]
    sync = sim(tmp_path, "sync", *common)
    streaming = sim(
        tmp_path, "streaming", *common, "engine.mode=streaming", "engine.fragments=1",
        "engine.delay=0", "engine.alpha=0",
    )  # fmt: skip
    a, b = weights(sync), weights(streaming)
    assert all(torch.equal(a[k], b[k]) for k in a)
    strip = lambda run: [{k: v for k, v in e.items()} for e in updates(run)]  # noqa: E731
    assert strip(sync) == strip(streaming)


@pytest.mark.timeout(60)
def test_overlap_hides_the_all_reduce_behind_the_next_rounds_steps(tmp_path):
    net = ["cluster=slow_network", "algorithm=local_sgd", "budget.max_updates=8"]
    sync = sim(tmp_path, "sync", *net)
    overlap = sim(tmp_path, "overlap", *net, "engine.mode=overlap")
    assert overlap.summary["bytes_sent"] == sync.summary["bytes_sent"]
    comm = updates(sync)[0]["comm_s"]
    assert comm > 0.03  # 2(N − 1)·5 ms of latency, and the transfer
    ends = lambda run: sorted({e["t"] for e in updates(run)})  # noqa: E731
    round_s = 10 * 0.02
    # sync: every round pays compute then the all-reduce; overlap: the all-reduce of round r
    # runs during round r + 1, merged at its end, so only the last one shows
    assert ends(sync) == pytest.approx([k * (round_s + comm) for k in range(1, 9)])
    assert ends(overlap) == pytest.approx([(k + 1) * round_s for k in range(1, 9)])


@pytest.mark.timeout(60)
def test_streaming_sends_each_fragment_in_turn(tmp_path):
    run = sim(
        tmp_path, "streaming", "algorithm=streaming_diloco", "algorithm.outer.inner_steps=10",
        "cluster=slow_network", "budget.max_updates=6",
    )  # fmt: skip
    d = sum(v.numel() for v in weights(run).values())
    halves = [4 * (d // 2), 4 * (d - d // 2)]  # the statistics ride free
    per_round = [2 * 3 * h // 4 for h in halves]  # a worker's share of the ring all-reduce
    first = [e for e in updates(run) if e["worker"] == 0]
    assert [e["bytes"] for e in first] == [per_round[k % 2] for k in range(6)]
    assert all(e["inner_steps"] == 5 for e in updates(run))
    assert run.summary["bytes_sent"] == 4 * sum(e["bytes"] for e in first)


@pytest.mark.timeout(60)
def test_int8_is_all_gathered_and_counted(tmp_path):
    run = sim(tmp_path, "int8", "algorithm=local_sgd", "engine.quantize=int8")
    errors = [e["wire_error"] for e in updates(run)]
    assert all(0.0 < err < 0.05 for err in errors), errors[:4]  # about 1 % here
    w = weights(run)
    d, tensors = sum(v.numel() for v in w.values()), len(w)
    piece = d + 4 * tensors  # int8 values and a float32 scale per tensor
    per_round = 4 * 3 * piece  # the all-gather (the statistics ride free)
    assert run.summary["bytes_sent"] == 12 * per_round
    evals = [e for e in run.events if e["kind"] == "eval" and e["split"] == "train"]
    assert evals[-1]["loss"] < evals[0]["loss"]


@pytest.mark.timeout(60)
def test_asynchronous_with_one_worker_is_sync_bit_for_bit(tmp_path):
    common = ["algorithm=local_sgd", "cluster.num_workers=1", "algorithm.name=x"]
    sync = sim(tmp_path, "sync", *common)
    asynchronous = sim(tmp_path, "async", *common, "engine.mode=async")
    a, b = weights(sync), weights(asynchronous)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [e["loss"] for e in updates(sync)] == [e["loss"] for e in updates(asynchronous)]


@pytest.mark.timeout(60)
def test_asynchronous_workers_go_on_while_one_is_paused(tmp_path):
    run = sim(
        tmp_path, "paused", "algorithm=local_sgd", "engine.mode=async", "cluster.compute_ms=10",
        "budget.max_updates=40", "cluster.faults=[{worker:1,at_s:0.05,duration_s:1.0}]",
    )  # fmt: skip
    during = [e for e in updates(run) if 0.2 < e["t"] < 1.0]
    assert {e["worker"] for e in during} == {0, 2, 3}  # worker 1 is paused, the rest push
    assert len(during) >= 3 * 7  # a round is 10 steps of 10 ms: 8 rounds each in 0.8 s
    lags = [e["lag"] for e in updates(run) if e["worker"] == 1]
    assert max(lags) >= 3 * 7  # its push after the pause is that stale
    homogeneous = sim(tmp_path, "plain", "algorithm=local_sgd", "engine.mode=async")
    mean_lag = statistics.fmean(e["lag"] for e in updates(homogeneous)[8:])
    assert mean_lag == pytest.approx(3.0, abs=0.25)  # M − 1 on equal workers


@pytest.mark.timeout(60)
def test_dynamic_local_updates_give_slow_workers_fewer_steps(tmp_path):
    run = sim(
        tmp_path, "dylu", "algorithm=local_sgd", "engine.mode=async", "engine.dynamic_local=true",
        "cluster.slowdown=[1,1,2,4]", "budget.max_updates=40",
    )  # fmt: skip
    steps = {}
    for e in updates(run):
        steps.setdefault(e["worker"], []).append(e["inner_steps"])
    # everyone's first round is H = 10; then H·speed/fastest, rounded (2.5 → 2)
    assert {w: (s[0], set(s[1:])) for w, s in steps.items()} == {
        0: (10, {10}),
        1: (10, {10}),
        2: (10, {5}),
        3: (10, {2}),
    }
    later = [e for e in updates(run) if e["clock"] >= 1]
    # so their rounds take about as long: 10·5 ms, 5·10 ms, 2·20 ms
    assert {round(e["compute_s"], 3) for e in later} == {0.05, 0.04}


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.usefixtures("one_fork_server")
def test_real_processes_a_pause_stalls_a_sync_round_but_not_the_async_workers(tmp_path):
    base = ["algorithm=local_sgd", "cluster.compute_ms=10"]  # rounds of 0.1 s
    pause = "cluster.faults=[{worker:1,at_s:0.3,duration_s:0.8}]"
    sync = run_job(tmp_path / "sync", [*base, pause, "budget.max_updates=8"])
    stalled = [e for e in updates(sync) if e["paused_s"] > 0]
    assert [e["worker"] for e in stalled] == [1]
    others = [
        e for e in updates(sync) if e["version"] == stalled[0]["version"] and e["worker"] != 1
    ]
    assert all(e["wait_s"] > 0.6 for e in others)  # everyone waited for the paused worker
    asynchronous = run_job(tmp_path / "async", [*base, pause, "engine.mode=async",
                                                  "budget.max_updates=60"])  # fmt: skip
    pushed = [e for e in updates(asynchronous) if e["worker"] == 1 and e["paused_s"] > 0]
    assert pushed, "worker 1's paused round was never pushed"
    t_pause = pushed[0]["t"]
    during = [e for e in updates(asynchronous) if t_pause - 0.7 < e["t"] < t_pause]
    assert {e["worker"] for e in during} == {0, 2, 3}  # the others went on pushing


@pytest.mark.timeout(60)
def test_an_overlapped_merge_is_logged_at_rank_0s_clock_and_the_wall_budget_by_the_exchange(
    tmp_path,
):
    """HPSGD (engine.mode=overlap), 2 workers, worker 1 three times slower, free network,
    10 ms steps, H = 10: worker 0 sends at 0.1 s and worker 1 at 0.3 s, so the exchange
    ends at 0.3 s; worker 0 reaches its merge after step 20 (0.2 s) and waits for it. The
    update is logged at rank 0's clock, 0.3 s (as in real processes), not at the slowest
    worker's (0.6 s), and what rank 0 waited is the slowest worker, not communication.
    With budget.max_wall_s=0.3 the run ends after that merge: the exchange ended at the
    budget."""
    run = sim(
        tmp_path, "overlap", "algorithm=hpsgd", "algorithm.outer.inner_steps=10",
        "cluster.num_workers=2", "cluster.compute_ms=10", "cluster.slowdown=[1,3]",
        "budget.max_updates=0", "budget.max_wall_s=0.3",
    )  # fmt: skip
    first = updates(run)[:2]
    assert [e["t"] for e in first] == pytest.approx([0.3, 0.3])
    assert [e["comm_s"] for e in first] == pytest.approx([0.0, 0.0])
    assert run.summary["updates"] == 1
