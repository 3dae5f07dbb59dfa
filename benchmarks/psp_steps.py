"""PSP's step-distribution experiment (docs/algorithms.md §6.3, the Owl book): 200 workers,
Gamma(1, 1) seconds per step, 200 virtual seconds, in the sim runtime. Reports, per barrier,
the distribution of the workers' final steps beside the published figures.

    python benchmarks/psp_steps.py       # writes benchmarks/results/psp_steps.json
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stalebench import experiment  # noqa: E402
from stalebench.metrics.events import read_events  # noqa: E402
from tests.conftest import compose  # noqa: E402

N = 200
BASE = [
    "runtime=sim",
    "cluster=owl_psp",
    f"cluster.num_workers={N}",
    "budget.max_wall_s=200",
    "budget.max_updates=0",
    "model=logreg",
    "dataset=synthetic",
    "dataset.num_features=10",
    "dataset.batch_size=8",
    "eval.every_s=0",
    "eval.train_samples=0",
    "logger=none",
]
SETTINGS = {
    "BSP": ["algorithm=bsp"],
    "ASP": ["algorithm=asp"],
    "SSP(s=4)": ["algorithm=ssp", "algorithm.barrier.staleness=4"],
    "pBSP(β=10)": ["algorithm=psp", "algorithm.barrier.sample_size=10"],
    "pSSP(β=10, s=4)": [
        "algorithm=psp",
        "algorithm.barrier.sample_size=10",
        "algorithm.barrier.staleness=4",
    ],
    **{
        f"pBSP(β={b})": ["algorithm=psp", f"algorithm.barrier.sample_size={b}"]
        for b in (0, 1, 2, 4, 8, 16, 32, 64)
    },
}
PUBLISHED = {
    "BSP": "≈ 30 steps, tight",
    "ASP": "≈ 100 steps, widely spread",
    "SSP(s=4)": "between BSP and ASP",
    "pBSP(β=10)": "nearly as tight as BSP, faster",
    "pBSP(β=4)": "close to SSP",
    "pBSP(β=0)": "= ASP",
}


def final_steps(overrides: list[str]) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose([*BASE, *overrides])
        cfg.run_dir = tmp
        summary = experiment.run(cfg)
        assert summary["status"] == "completed", summary["error"]
        steps = np.zeros(N, dtype=int)
        for e in read_events(Path(tmp) / "events.jsonl"):
            if e["kind"] == "update":
                steps[e["worker"]] = max(steps[e["worker"]], e["clock"] + 1)
    return steps


def main() -> None:
    rows = {}
    for name, overrides in SETTINGS.items():
        s = final_steps(overrides)
        rows[name] = {
            "mean": float(s.mean()),
            "min": int(s.min()),
            "p10": float(np.percentile(s, 10)),
            "p50": float(np.median(s)),
            "p90": float(np.percentile(s, 90)),
            "max": int(s.max()),
            "std": float(s.std()),
            "published": PUBLISHED.get(name, ""),
        }
        r = rows[name]
        print(
            f"{name:18s} mean {r['mean']:6.1f}  min {r['min']:4d}  p10 {r['p10']:6.1f}  "
            f"p50 {r['p50']:6.1f}  p90 {r['p90']:6.1f}  max {r['max']:4d}  std {r['std']:5.1f}"
            f"  published: {r['published']}"
        )
    out = ROOT / "benchmarks" / "results" / "psp_steps.json"
    out.write_text(json.dumps(rows, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
