"""How a device's throughput falls at small minibatches: the measured curves behind
`cluster.utilization_curve` (the throughput tables' step at a few examples a node is not
the step at hundreds scaled down: small matrix products keep the cores less busy).

    python benchmarks/utilisation.py [--quick]
        # writes benchmarks/results/utilisation_<model>.csv (batch,relative) and
        # benchmarks/results/utilisation.json (every time, the machine)

For each of das_throughput's models (VGG-A, OverFeat-FAST, the 7-layer DNN, at their input
shapes) a training step's forward and backward is timed on this machine at minibatches of
1, 2, 4, … (the fastest of `--repeats` after one to warm up, on `--threads` of torch's),
and `relative` is its examples a second over the best measured. The largest minibatch
measured stands for every larger one (the curve is flat past its end). This machine is not
the papers' (a two-socket Haswell Xeon of 28 cores): its curve is a measurement of the
effect, not of their nodes, and the tables' pages say so.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stalebench.job import build_model, load_splits  # noqa: E402
from stalebench.runtime.compute import time_step  # noqa: E402
from tests.conftest import compose  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
# (model, the das_throughput row that sets its shapes, the minibatches measured)
MODELS = {
    "vgga": ("vgga_64", [1, 2, 4, 8, 16, 32]),
    "overfeat": ("overfeat_64", [1, 2, 4, 8, 16, 32]),
    "dnn": ("dnn_16", [1, 2, 4, 8, 16, 32, 64, 128, 256]),
}


def measure(row: str, batches: list[int], repeats: int) -> list[dict]:
    largest = max(batches)  # the composed run's minibatch (its model's shapes)
    cfg = compose([
        "+sweep=das_throughput", f"+sweep/arms/das_table={row}", "+sweep/arms/das_nodes=one",
        f"dataset.batch_size={largest}", "sim.numerics=true",
    ])  # fmt: skip
    splits = load_splits(cfg)
    model = build_model(cfg, splits)
    rows = []
    gen = torch.Generator().manual_seed(0)  # `shape` holds sizes, no values: draw some
    for b in batches:
        x = torch.randn(b, *splits.input_shape, generator=gen)
        y = torch.randint(splits.num_classes, (b,), generator=gen)
        seconds = time_step(model, x, y, repeats, clock=time.perf_counter, stat=min)
        rows.append({"batch": b, "step_s": seconds, "per_s": b / seconds})
        print(f"  {row}: batch {b}: {seconds:.4f} s, {b / seconds:.2f} examples/s", flush=True)
    best = max(r["per_s"] for r in rows)
    for r in rows:
        r["relative"] = r["per_s"] / best
    return rows


def cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/utilisation.py")
    parser.add_argument("--quick", action="store_true", help="1 repeat, batches up to 8")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--threads", type=int, default=0, help="torch's threads (0: as set)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = 1 if args.quick else args.repeats
    out = {"machine": {"cpu": cpu(), "torch_threads": torch.get_num_threads(),
                       "torch": torch.__version__}, "repeats": repeats, "models": {}}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (row, batches) in MODELS.items():
        batches = [b for b in batches if b <= 8] if args.quick else batches
        rows = measure(row, batches, repeats)
        out["models"][name] = {"row": row, "rows": rows}
        lines = ["batch,relative", *(f"{r['batch']},{r['relative']:.4f}" for r in rows)]
        (args.out / f"utilisation_{name}.csv").write_text("\n".join(lines) + "\n")
    (args.out / "utilisation.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
