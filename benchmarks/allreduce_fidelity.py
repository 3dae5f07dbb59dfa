"""Sim-vs-real fidelity of the allreduce engine (DDP-style BSP) under a network-dominated
profile: updates/s of real runs against the simulator's for N = 1, 2, 4 workers.

    python benchmarks/allreduce_fidelity.py   # writes benchmarks/results/allreduce_fidelity.json

The simulator charges a round max(compute) + Network.allreduce_s(message); a real round also
pays gloo's own all-reduce, Python and process scheduling, so real/sim < 1 is the overhead
the model leaves out. On a 2-core machine N = 4 runs 4 processes on 2 cores (oversubscribed):
the host's cores and load are recorded with every run.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stalebench import experiment  # noqa: E402
from stalebench.engines.rounds import round_bytes  # noqa: E402
from stalebench.job import Job  # noqa: E402
from stalebench.metrics.events import read_events  # noqa: E402
from stalebench.runtime.network import Network  # noqa: E402
from tests.conftest import compose  # noqa: E402

# the network dominates: 315 KB of gradient behind 2 ms and 0.1 Gbit/s each way, 20 ms steps
CONFIG = [
    "engine=allreduce",
    "algorithm=bsp",
    "model=mlp",
    "model.hidden=[256,256]",
    "dataset=synthetic",
    "dataset.num_features=40",
    "dataset.num_classes=10",
    "dataset.batch_size=32",
    "cluster=homogeneous",
    "cluster.compute_ms=20",
    "cluster.push_latency_ms=2",
    "cluster.pull_latency_ms=2",
    "cluster.push_bandwidth_gbps=0.1",
    "cluster.pull_bandwidth_gbps=0.1",
    "budget.max_wall_s=0",
    "budget.max_updates=100",
    "eval.every_s=0",
    "eval.train_samples=0",
    "logger=none",
    "timeout_s=60",
]
WORKERS = (1, 2, 4)
REPEATS = 3


def modelled(workers: int) -> dict:
    """The profile's prediction of one round: a step, and the all-reduce of the message."""
    cfg = compose([*CONFIG, f"cluster.num_workers={workers}"])
    job = Job.build(cfg)
    d = sum(p.numel() for p in job.model().parameters())
    nbytes = round_bytes(d, workers)
    allreduce_s = Network(cfg.cluster).allreduce_s(nbytes)
    step_s = max(job.profile.step_s(w) for w in range(workers))
    return {
        "params": d,
        "message_bytes": nbytes,
        "allreduce_s": allreduce_s,
        "round_s": step_s + allreduce_s,
    }


def run(workers: int, runtime: str) -> dict:
    """One run; updates/s is rounds over the end of the last applied round (the real engine
    runs one more, unapplied, round to stop all replicas together: it is not counted)."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose([*CONFIG, f"runtime={runtime}", f"cluster.num_workers={workers}"])
        cfg.run_dir = tmp
        load_before = os.getloadavg()[0]
        start = time.perf_counter()
        summary = experiment.run(cfg)
        elapsed = time.perf_counter() - start
        updates = [e for e in read_events(Path(tmp) / "events.jsonl") if e["kind"] == "update"]
    assert summary["status"] == "completed", (workers, runtime, summary["error"])
    last = max(updates, key=lambda e: e["version"])
    return {
        "updates": last["version"],
        "updates_per_s": last["version"] / last["t"],
        "round_s": last["t"] / last["version"],
        "mean_comm_s": statistics.mean(e["comm_s"] for e in updates),
        "mean_wait_s": statistics.mean(e["wait_s"] for e in updates),
        "bytes_sent": summary["bytes_sent"],
        "elapsed_s": elapsed,
        "load_avg_1m_before": load_before,
        "load_avg_1m_after": os.getloadavg()[0],
    }


def main() -> None:
    # Interleaved repetitions (real, then sim, per N, REPEATS times): the machine is shared,
    # so a burst of load hits one repetition of every N rather than every repetition of one.
    runs = {(n, rt): [] for n in WORKERS for rt in ("real", "sim")}
    for _ in range(REPEATS):
        for n in WORKERS:
            for rt in ("real", "sim"):
                runs[n, rt].append(run(n, rt))
    rows = []
    for n in WORKERS:
        real = [r["updates_per_s"] for r in runs[n, "real"]]
        sim = runs[n, "sim"][0]  # deterministic: every repetition is the same
        assert all(r["updates_per_s"] == sim["updates_per_s"] for r in runs[n, "sim"])
        rows.append(
            {
                "workers": n,
                "oversubscribed": n > (os.cpu_count() or 1),
                "model": modelled(n),
                "real_updates_per_s_median": statistics.median(real),
                "real_updates_per_s_all": real,
                "sim_updates_per_s": sim["updates_per_s"],
                "ratio_real_over_sim": statistics.median(real) / sim["updates_per_s"],
                "real_runs": runs[n, "real"],
                "sim_run": sim,
            }
        )
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "load_avg_at_end": list(os.getloadavg()),
        },
        "config": CONFIG,
        "repeats": REPEATS,
        "rows": rows,
    }
    out = ROOT / "benchmarks" / "results" / "allreduce_fidelity.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{os.cpu_count()} cores; load average now {os.getloadavg()[0]:.2f} (1 min)")
    for r in rows:
        loads = [x["load_avg_1m_before"] for x in r["real_runs"]]
        print(
            f"N={r['workers']}: real {r['real_updates_per_s_median']:.2f} updates/s (median of "
            f"{', '.join(f'{x:.2f}' for x in r['real_updates_per_s_all'])}), sim "
            f"{r['sim_updates_per_s']:.2f}, real/sim {r['ratio_real_over_sim']:.3f}; "
            f"all-reduce {1e3 * r['model']['allreduce_s']:.1f} ms of a "
            f"{1e3 * r['model']['round_s']:.1f} ms round; load before real runs "
            f"{', '.join(f'{x:.2f}' for x in loads)}"
            + (" (oversubscribed)" if r["oversubscribed"] else "")
        )


if __name__ == "__main__":
    main()
