"""The memory a run's evaluation holds: a simulated run of a 16 MB model (an MLP of
4.1 M parameters) that changes θ at every step, snapshotted every 0.1 s of its 60 s, with
the snapshots past the latest few spilled to disk (`evaluation.KEEP`, the default) and
with every one kept in memory (`KEEP` unbounded: before issue 69).

    python benchmarks/eval_memory.py [--seconds 60] [--smoke]
        # writes benchmarks/results/eval_memory.json

Each arm runs in a process of its own; its peak resident memory is the process's
`ru_maxrss`, its time the process's wall time (the run and its evaluation). Target (issue
69): spilled, the peak stays within KEEP + PENDING + 4 = 12 copies of θ (about 190 MB) of
the baseline run's, which snapshots at its start and end only, whatever the run's length —
the latest KEEP, PENDING waiting for the writer, the one it writes, the simulator's held
θ, and at the evaluation the copy read back and the model's own parameters; kept, it grows
by one model per snapshot.

    python benchmarks/eval_memory.py --seconds 120 --arms one_snapshot,spilled  # longer
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "eval_memory.json"

CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from stalebench import evaluation, experiment
from tests.conftest import compose
evaluation.KEEP = {keep}
cfg = compose({overrides!r})
cfg.run_dir = {run_dir!r}
start = time.perf_counter()
summary = experiment.run(cfg)
wall = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MB (Linux: KiB)
print(json.dumps({{"status": summary["status"], "wall_s": wall, "peak_mb": peak,
                  "snapshots_evaluated": sum(1 for _ in open({run_dir!r} + "/events.jsonl")
                                             if '"eval"' in _)}}))
"""


def overrides(seconds: float, every_s: float, hidden: int) -> list[str]:
    return [
        "runtime=sim", "logger=none", "algorithm=asp", "cluster=homogeneous",
        "cluster.num_workers=1", "cluster.compute_ms=100", f"budget.max_wall_s={seconds}",
        "dataset=synthetic", "dataset.num_features=40", "dataset.num_test=256",
        "model=mlp", f"model.hidden=[{hidden},{hidden}]", f"eval.every_s={every_s}",
        "eval.every_updates=0", "eval.train_samples=0", "seed=1",
    ]  # fmt: skip


def arm(keep: int, seconds: float, every_s: float, hidden: int) -> dict:
    """One run in a child process: its status, wall time and peak resident memory (MB)."""
    with tempfile.TemporaryDirectory() as tmp:
        code = CHILD.format(root=str(ROOT), keep=keep, run_dir=str(Path(tmp) / "run"),
                            overrides=overrides(seconds, every_s, hidden))  # fmt: skip
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True)  # fmt: skip
        return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--smoke", action="store_true", help="a 2 s run of a small model")
    parser.add_argument("--arms", default="one_snapshot,spilled,kept")
    args = parser.parse_args()
    seconds, every_s, hidden = (2.0, 0.1, 200) if args.smoke else (args.seconds, 0.1, 2000)
    params = 40 * hidden + hidden + hidden * hidden + hidden + hidden * 10 + 10
    rows = {}
    # a run snapshotted at its start and end only (the baseline), then every 0.1 s spilled,
    # then every copy kept
    for name, keep, every in (("one_snapshot", 4, 0.0), ("spilled", 4, every_s),
                              ("kept", 10**9, every_s)):  # fmt: skip
        if name not in args.arms.split(","):
            continue
        if every == 0.0:
            row = arm(keep, seconds, seconds, hidden)  # a snapshot at 0 and at the end
        else:
            row = arm(keep, seconds, every, hidden)
        rows[name] = row
        print(name, row, flush=True)
    result = {
        "model_mb": 4 * params / 2**20,
        "params": params,
        "seconds": seconds,
        "every_s": every_s,
        "snapshots": int(seconds / every_s) + 1,
        "arms": rows,
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if not args.smoke and args.arms == parser.get_default("arms"):
        RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
