"""The simulator's events per second, one gradient at a time (`sim.batch=off`) and batched
(`sim.batch=auto`, or `on`), against a bare single-process training loop on the same model
and data, at 10 to 10,000 simulated workers.

    python benchmarks/sim_batch.py [--quick]     # writes benchmarks/results/sim_batch.json

Targets (issue 30): for models of CNN class (≤ 100k parameters), batched events/s ÷ bare
loop ≥ 2 at 100 and 1,000 workers; the 1M-parameter MLP never below one at a time (auto
leaves it unbatched); at 10,000 workers ≥ 0.8 × the 1,000-worker rate; ResNet-20 on
CIFAR-10-shaped data at 32 workers: the batched speed-up over one at a time, reported.
Every rate is ASP on the gamma profile, one thread; the bare loop's steps/s are measured in
the same process, interleaved with the simulator's runs.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import sim_throughput  # noqa: E402
from benchmarks.baselines import plain_loop  # noqa: E402
from stalebench.data.cifar import TEST_FILE, TRAIN_FILES  # noqa: E402

SYNTHETIC = [  # 200,000 samples of 40 features: every worker count has its shard or samples
    "dataset=synthetic",
    "dataset.num_features=40",
    "dataset.num_classes=10",
    "dataset.num_train=200000",
    "dataset.batch_size=32",
]
MODELS = {
    "mlp": ["model=mlp", "model.hidden=[64]", *SYNTHETIC],  # 3,274 parameters
    "cnn": ["model=cnn", *SYNTHETIC],  # 4,842 (Conv1d over the 40 features)
    "mlp1m": ["model=mlp", "model.hidden=[1000,1000]", *SYNTHETIC],  # 1,052,010
    "resnet20": ["model=resnet20", "dataset=cifar10", "dataset.augment=false"],  # 272,474
}
# (model, workers, updates, modes): the figures. 10,000 workers run as many events per
# worker as 1,000 do (10x the events): a run of 3x (under 2 per worker) is a third set-up
# transients — each worker's first reply and last stop — which no longer-lived run has.
CASES = [
    *[
        ("mlp", n, 6000 * (10 if n == 10000 else 1), ("off", "auto"))
        for n in (10, 100, 1000, 10000)
    ],
    *[
        ("cnn", n, 3000 * (10 if n == 10000 else 1), ("off", "auto"))
        for n in (10, 100, 1000, 10000)
    ],
    ("mlp1m", 32, 200, ("off", "auto", "on")),
    ("resnet20", 32, 96, ("off", "on")),
]
BARE_STEPS = {"mlp": 6000, "cnn": 3000, "mlp1m": 300, "resnet20": 40}


def cifar_files(root: Path, per_file: int = 1000) -> Path:
    """CIFAR-10's python batches, generated (uint8 images, labels 0-9), in the real format."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    for name in [*TRAIN_FILES, TEST_FILE]:
        data = rng.integers(0, 256, size=(per_file, 3072), dtype=np.uint8)
        batch = {b"labels": rng.integers(0, 10, per_file).tolist(), b"data": data}
        (root / name).write_bytes(pickle.dumps(batch, protocol=2))
    return root


def overrides(model: str, data: Path) -> list[str]:
    extra = [f"dataset.root={data}"] if model == "resnet20" else []
    return [*MODELS[model], *extra]


def sim(model: str, workers: int, updates: int, batch: str, data: Path) -> dict:
    return sim_throughput.sim(workers, updates, batch, overrides(model, data))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/sim_batch.py")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a tenth of the updates")
    parser.add_argument("--only", default="", help="models named so (comma-separated)")
    parser.add_argument("--workers", default="", help="only these worker counts (comma-separated)")
    args = parser.parse_args()
    k = 0.1 if args.quick else 1.0
    torch.set_num_threads(1)
    only, workers = set(filter(None, args.only.split(","))), args.workers.split(",")
    cases = [
        c
        for c in CASES
        if (not only or c[0] in only) and (not args.workers or str(c[1]) in workers)
    ]
    models = sorted({c[0] for c in cases}, key=list(MODELS).index)
    bare: dict[str, list[float]] = {m: [] for m in models}
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as data_dir:
        data = cifar_files(Path(data_dir) / "cifar")
        for r in range(args.repeats):
            for m in models:
                bare[m].append(plain_loop(overrides(m, data), max(10, int(BARE_STEPS[m] * k))))
                print(f"[{r}] bare {m}: {bare[m][-1]:.1f} steps/s", flush=True)
            for model, n, updates, modes in cases:
                for mode in modes if r % 2 == 0 else modes[::-1]:
                    key = f"{model}/{n}_workers/{mode}"
                    out = sim(model, n, max(50, int(updates * k)), mode, data)
                    runs.setdefault(key, []).append(out)
                    print(f"[{r}] {key}: {out['events_per_s']:.1f} events/s", flush=True)
    rows = {}
    for key, outs in runs.items():
        model = key.split("/")[0]
        rates = [o["events_per_s"] for o in outs]
        rows[key] = {
            "events_per_s_median": statistics.median(rates),
            "events_per_s_best": max(rates),
            "ratio_to_bare_median": statistics.median(rates) / statistics.median(bare[model]),
            "sim_batch": outs[-1]["sim_batch"],
        }
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        },
        "quick": args.quick,
        "bare_steps_per_s": bare,
        "figures": rows,
    }
    name = "sim_batch" + ("_cuda" if torch.cuda.is_available() else "")
    name += ("_quick" if args.quick else "") + ("_part" if only or args.workers else "")
    out = ROOT / "benchmarks" / "results" / f"{name}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n| model / workers / batch | events/s (median) | ÷ bare loop | mean batch |")
    print("|---|---|---|---|")
    for key, row in rows.items():
        mean = (row["sim_batch"] or {}).get("mean", "—")
        print(
            f"| {key} | {row['events_per_s_median']:.0f} | {row['ratio_to_bare_median']:.2f} "
            f"| {mean} |"
        )
    for m in models:
        print(f"bare loop {m}: median {statistics.median(bare[m]):.1f} steps/s")


if __name__ == "__main__":
    main()
