"""A cost-only simulation at a paper's scale, timed as a researcher runs it: the whole
`stalebench` command (start-up, the loop, events.jsonl, metrics.parquet, summary.json) for
90 epochs of ImageNet on ResNet-50 over 32 nodes (14,076 iterations, V100 step times,
10 Gbit/s links), AllReduce SGD (batch 256 a node) and SGP (one peer an iteration).

    python benchmarks/cost_only.py [--repeats 3] [--only allreduce]
    # writes benchmarks/results/cost_only.json

Target (issue 71): the AllReduce command in under 10 s on the CI's 2-core machine. Each
repeat runs in a fresh process into a fresh run directory, the arms interleaved; the median
and the best are reported, with the loop's own share (`sim_loop_s` of summary.json). The
simulator is pure Python, and a machine's speed at it moves from day to day: each repeat
also times a fixed pure-Python loop (`REFERENCE`), whose median goes with the figures, so
that two days' figures can be read against each other.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "cost_only.json"
TARGET_S = 10.0  # the AllReduce arm's whole command

COMMON = [
    "runtime=sim", "sim.numerics=false", "model=resnet50", "dataset=shape",
    "cluster=homogeneous", "cluster.num_workers=32", "cluster.device=v100",
    "cluster.push_bandwidth_gbps=10", "cluster.pull_bandwidth_gbps=10",
    "budget.max_updates=14076", "budget.max_wall_s=0", "logger=local",
]  # fmt: skip
# 10⁷ additions in a fresh interpreter, its seconds printed: the machine's pure-Python speed
REFERENCE = (
    "import time; t = time.perf_counter(); s = 0\n"
    "for i in range(10_000_000): s += i\n"
    "print(time.perf_counter() - t)"
)
ARMS = {
    "allreduce": ["engine=allreduce", "algorithm=bsp", "dataset.batch_size=256"],
    "sgp": ["algorithm=sgp", "dataset.batch_size=256"],
}


def run_once(arm: str, workdir: Path) -> dict:
    """One whole command, in its own process: its wall seconds and its summary's."""
    run_dir = workdir / f"{arm}-{time.monotonic_ns()}"
    cmd = [sys.executable, "-c", "from stalebench.cli import script; script()",
           *COMMON, *ARMS[arm], f"hydra.run.dir={run_dir}"]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    wall = time.perf_counter() - start
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"wall_s": wall, "sim_loop_s": summary["sim_loop_s"], "updates": summary["updates"],
            "events": sum(1 for _ in open(run_dir / "events.jsonl"))}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/cost_only.py")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=sorted(ARMS), action="append")
    args = parser.parse_args(argv)
    arms = args.only or list(ARMS)
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    reference: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):  # interleaved: a busy moment costs every arm
            for arm in arms:
                runs[arm].append(run_once(arm, Path(tmp)))
                print(arm, {k: round(v, 2) for k, v in runs[arm][-1].items()}, flush=True)
            loop = subprocess.run([sys.executable, "-c", REFERENCE], check=True,
                                  capture_output=True, text=True)  # fmt: skip
            reference.append(float(loop.stdout))
            print("reference loop", round(reference[-1], 2), flush=True)
    figures = {}
    for arm, got in runs.items():
        walls = [r["wall_s"] for r in got]
        figures[arm] = {
            "wall_s_median": statistics.median(walls), "wall_s_best": min(walls),
            "sim_loop_s_median": statistics.median(r["sim_loop_s"] for r in got),
            "updates": got[0]["updates"], "events": got[0]["events"], "wall_s": walls,
        }  # fmt: skip
    if "allreduce" in figures:
        figures["allreduce"]["target_s"] = TARGET_S
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": __import__("torch").__version__,
            "python_loop_s": statistics.median(reference),  # `REFERENCE`, the median
        },  # fmt: skip
        "repeats": args.repeats,
        "command": COMMON,
        "arms": ARMS,
        "figures": figures,
    }
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(RESULT.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
