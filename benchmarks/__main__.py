"""stalebench against PyTorch's own baselines, every figure as a ratio from one run.

    python -m benchmarks            # writes benchmarks/results/baselines.json, prints the table
    python -m benchmarks --repeats 1 --quick   # a smoke run

Each figure pairs a stalebench run with a reference written directly on PyTorch
(`benchmarks.baselines`): same model, θ₀, batch 32 and MNIST-1D stream, one thread per
process. The pairs are interleaved (their order alternates per repeat) and each side's
best and median over the repeats are kept, with the machine's load average before and
after each measurement. Ratios are stalebench ÷ reference (≥ 1: stalebench is faster,
except the start-up figure, where it is a multiple of `import torch`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import baselines  # noqa: E402
from benchmarks.sim_throughput import bare_loop, sim  # noqa: E402
from stalebench import experiment  # noqa: E402
from stalebench.metrics.events import read_events  # noqa: E402
from tests.conftest import compose  # noqa: E402

MODELS = {
    "cnn": ["model=cnn"],  # 4,842 parameters
    "mlp1m": ["model=mlp", "model.hidden=[1000,1000]"],  # 1,052,010
    "mlp2m": ["model=mlp", "model.hidden=[1500,1500]"],  # 2,328,010
}
STEPS = {"cnn": 3000, "mlp1m": 600, "mlp2m": 300}
# overlapping communication with computation (buckets, P3), 2 workers, each profile with the
# model, steps, bucket and slice sizes (MB) it is measured with: slow_network as it ships
# (20 ms steps, 5 ms and 100 Mbit/s per message), and a link where a round's all-reduce
# takes about a step (P3's regime: 80 ms steps, 0.05 ms and 500 Mbit/s) on six 1 MB layers
OVERLAP = {
    "slow_network": (
        ["cluster=slow_network", "cluster.compute_ms=20", *MODELS["cnn"]],
        100,
        0.01,
        0.005,
    ),
    "balanced": (
        [
            "cluster=slow_network",
            "cluster.compute_ms=80",
            "cluster.push_latency_ms=0.05",
            "cluster.pull_latency_ms=0.05",
            "cluster.push_bandwidth_gbps=0.5",
            "cluster.pull_bandwidth_gbps=0.5",
            "model=mlp",
            "model.hidden=[512,512,512,512,512,512]",
        ],
        40,
        1.0,
        0.25,
    ),
}
QUIET = [
    "cluster=homogeneous",
    "cluster.compute_ms=0",
    "logger=none",
    "eval.every_s=0",
    "eval.every_updates=0",
    "eval.train_samples=0",
    "budget.max_wall_s=0",
]


def stalebench_rate(overrides: list[str], updates: int, warmup: int = 0) -> float:
    """Updates/s of a real stalebench run, from its summary (start-up excluded: the run's
    clock starts when every rank is set up); `updates` 0: the overrides' budget.max_wall_s
    ends it. `warmup` > 0: the rate after the run's first `warmup` updates, from the times
    of its update events (a GPU's first steps load its kernels)."""
    keys = {o.split("=")[0] for o in overrides}
    quiet = [q for q in QUIET if q.split("=")[0] not in keys]  # a profile's own compute time
    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose([*quiet, *overrides, f"budget.max_updates={updates}"])
        cfg.run_dir = tmp
        summary = experiment.run(cfg)
        events = read_events(Path(tmp) / "events.jsonl") if warmup else []
    assert summary["status"] == "completed", summary["error"]
    if not warmup:
        return summary["throughput_updates_per_s"]
    timed = sorted(e["t"] for e in events if e["kind"] == "update")[warmup:]
    assert len(timed) > 1, f"{len(timed)} updates after a warm-up of {warmup}"
    return (len(timed) - 1) / (timed[-1] - timed[0])


def first_update_s() -> float:
    """Seconds from the `stalebench` command to its first update in events.jsonl, for a
    4-worker real run of the CNN; then the run is interrupted."""
    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp) / "run" / "events.jsonl"
        args = [
            *QUIET,
            "model=cnn",
            "algorithm=asp",
            "budget.max_updates=1000000",
            f"run_dir={Path(tmp) / 'run'}",
        ]
        start = time.perf_counter()
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "stalebench"), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # an update event's kind, not the start event's `parts` (which name an "update" rule)
        while not (events.exists() and '"kind": "update"' in events.read_text()):
            if proc.poll() is not None or time.perf_counter() - start > 120:
                raise RuntimeError("the run ended before its first update")
            time.sleep(0.005)
        took = time.perf_counter() - start
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    return took


def figures(quick: bool) -> dict:
    """name -> (stalebench measurement, reference measurement, unit), each a thunk."""
    k = 0.2 if quick else 1.0
    steps = {m: max(20, int(s * k)) for m, s in STEPS.items()}
    out = {}
    for m in MODELS:
        ps = [*MODELS[m], "algorithm=asp", "cluster.num_workers=1"]
        out[f"ps_asp_1_worker/{m}"] = (
            lambda ps=ps, m=m: stalebench_rate(ps, steps[m]),
            lambda m=m: baselines.plain_loop(MODELS[m], steps[m]),
            "steps/s ÷ plain SGD loop",
        )
    for m in ("cnn", "mlp1m"):
        ar = [*MODELS[m], "engine=allreduce", "algorithm=bsp", "cluster.num_workers=2"]
        out[f"allreduce_bsp_2/{m}"] = (
            lambda ar=ar, m=m: stalebench_rate(ar, steps[m]),
            lambda m=m: baselines.spawn(baselines.ddp_rank, 2, MODELS[m], steps[m]),
            "steps/s ÷ DDP (gloo)",
        )
    ps2 = [*MODELS["mlp1m"], "algorithm=asp", "cluster.num_workers=2"]
    for name, rank in (("gloo", baselines.gloo_ps_rank), ("rpc", baselines.rpc_ps_rank)):
        out[f"ps_asp_2_workers/mlp1m/{name}"] = (
            lambda: stalebench_rate(ps2, 2 * steps["mlp1m"]),
            lambda rank=rank: baselines.spawn(rank, 3, MODELS["mlp1m"], steps["mlp1m"]),
            f"updates/s ÷ hand-written {name} PS",
        )
    for prof, (args, n, bucket, piece) in OVERLAP.items():
        n = max(20, int(n * k))
        base = [*args, "engine=allreduce", "algorithm=bsp", "cluster.num_workers=2"]
        schedules = {
            "one_message": [],
            "buckets": [f"engine.bucket_mb={bucket}"],
            "p3": [f"engine.bucket_mb={piece}", "engine.schedule=p3"],
        }
        for name, extra in schedules.items():
            out[f"allreduce_overlap/{prof}/{name}"] = (
                lambda o=[*base, *extra], n=n: stalebench_rate(o, n),
                lambda a=args, n=n, b=bucket: baselines.spawn(
                    baselines.ddp_profiled_rank, 2, a, n, b
                ),
                f"steps/s ÷ DDP ({bucket} MB buckets) on the same emulated cluster",
            )
    out["start_to_first_update/cnn_4_workers"] = (
        first_update_s,
        baselines.import_torch_s,
        "seconds ÷ `import torch` seconds",
    )
    sim_updates = 1500 if quick else 6000
    out["sim_bare_loop"] = (None, lambda: bare_loop(sim_updates), "steps/s")
    for n in (10, 100, 1000, 10000):
        updates = sim_updates * (10 if n == 10000 else 1)  # as many events per worker as 1,000
        for name, batch in (("one_at_a_time", "off"), ("batched", "auto")):
            out[f"sim/{n}_workers/{name}"] = (
                lambda n=n, u=updates, b=batch: sim(n, u, b)["events_per_s"],
                None,
                "events/s ÷ bare loop",
            )
    return out


def measure(thunk) -> dict:
    before = os.getloadavg()[0]
    value = thunk()
    return {"value": value, "load_before": before, "load_after": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer steps: a smoke run")
    parser.add_argument("--only", default="", help="figures whose name contains this")
    args = parser.parse_args()
    figs = {n: f for n, f in figures(args.quick).items() if args.only in n}
    runs = {n: {"stalebench": [], "reference": []} for n in figs}
    started = time.perf_counter()
    for r in range(args.repeats):
        for name, (ours, ref, _) in figs.items():
            sides = [("stalebench", ours), ("reference", ref)]
            for side, thunk in sides if r % 2 == 0 else sides[::-1]:
                if thunk is not None:
                    runs[name][side].append(measure(thunk))
                    print(f"[{r}] {name} {side}: {runs[name][side][-1]['value']:.4g}", flush=True)
    bare = [m["value"] for m in runs.get("sim_bare_loop", {}).get("reference", [])]
    rows = {}
    for name, (_, _, unit) in figs.items():
        ours = [m["value"] for m in runs[name]["stalebench"]]
        ref = [m["value"] for m in runs[name]["reference"]] or bare
        if not ours or not ref:
            continue
        lower = name.startswith("start_to_first_update")  # seconds: lower is better
        best = min if lower else max
        rows[name] = {
            "unit": unit,
            "stalebench_median": statistics.median(ours),
            "reference_median": statistics.median(ref),
            "ratio_median": statistics.median(ours) / statistics.median(ref),
            "ratio_best": best(ours) / best(ref),
        }
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "repeats": args.repeats,
        "quick": args.quick,
        "wall_s": time.perf_counter() - started,
        "figures": rows,
        "runs": runs,
    }
    name = "baselines_quick" if args.quick else "baselines"
    if args.only:  # a part of the figures: its own file, named after the filter
        name = "baselines_" + "".join(c if c.isalnum() else "_" for c in args.only)
    out = ROOT / "benchmarks" / "results" / f"{name}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n| figure | unit | stalebench | reference | ratio (median) | ratio (best) |")
    print("|---|---|---|---|---|---|")
    for name, row in rows.items():
        print(
            f"| {name} | {row['unit']} | {row['stalebench_median']:.4g} | "
            f"{row['reference_median']:.4g} | {row['ratio_median']:.2f} | {row['ratio_best']:.2f} |"
        )
    print(f"\n{result['wall_s']:.0f} s; written to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
