"""Nesterov-PP's small-scale claim (ALGORITHMS.md §10.5, §15 item 3): on a character-level
task, after the same number of steps, the asynchronous pipeline with NAdamW β₁ = 0.99
(and the paper's own equation) reaches a lower validation loss than PipeDream-AdamW and no
worse than synchronous GPipe; without the (1 − γ) discount training diverges or is clearly
worse. The presets as shipped (4 stages, a 4-block decoder of width 64 on the generated
corpus, 100 warm-up steps, the Adam family with weight decay 0.01), with a cosine decay to 0.1·η over the rest
of the budget, in the sim runtime (numerically the real pipeline: the tests check it step
for step).

    python benchmarks/pipeline_ordering.py [--steps 1000] [--seeds 0 1 2] [--jobs 2]
    # writes benchmarks/results/pipeline_ordering.json and prints a Markdown table
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SETTINGS = {
    "GPipe (sync, AdamW β₁=0.9)": ["algorithm=gpipe"],
    "PipeDream (AdamW β₁=0.9, WS)": ["algorithm=pipedream"],
    "Nesterov-PP: NAdamW β₁=0.99, WS": ["algorithm=nesterov_pp"],
    "Nesterov-PP: NAdamW β₁=0.99, no WS": [
        "algorithm=nesterov_pp",
        "algorithm.pipeline.weight_stashing=false",
    ],
    "Nesterov-PP: paper equation, γ=0.99, WS": [
        "algorithm=nesterov_pp",
        "algorithm/optimizer=nesterov_pp",
    ],
    "paper equation without (1−γ), WS": [
        "algorithm=nesterov_pp",
        "algorithm/optimizer=nesterov_pp",
        "algorithm.optimizer.discount=false",
    ],
}


def one(name: str, overrides: list[str], seed: int, steps: int) -> dict:
    from stalebench import experiment
    from stalebench.metrics.events import read_events
    from tests.conftest import compose

    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose(
            [
                *overrides,
                "runtime=sim",
                f"budget.max_updates={steps}",
                f"algorithm.optimizer.cosine_steps={max(steps - 100, 1)}",
                f"eval.every_updates={max(steps // 10, 1)}",
                "eval.train_samples=0",
                "logger=none",
                f"seed={seed}",
                f"run_dir={tmp}",
            ]
        )
        summary = experiment.run(cfg)
        evals = sorted(
            (e for e in read_events(Path(tmp) / "events.jsonl") if e["kind"] == "eval"),
            key=lambda e: e["version"],
        )
    return {
        "setting": name,
        "seed": seed,
        "status": summary["status"],
        "steps": summary["updates"],
        "val_loss": [(e["version"], e["loss"]) for e in evals],
        "final_val_loss": summary["final"]["loss"] if summary["final"] else None,
    }


def fmt(values: list[float | None]) -> str:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return "—"
    mean = sum(finite) / len(finite)
    std = (sum((v - mean) ** 2 for v in finite) / max(len(finite) - 1, 1)) ** 0.5
    missing = f" ({len(values) - len(finite)} missing)" if len(finite) < len(values) else ""
    return f"{mean:.3f} ± {std:.3f}{missing}"


def table(rows: list[dict], steps: int) -> str:
    """Validation loss at a quarter, half, three quarters and the end of the budget."""
    every = max(steps // 10, 1)
    marks = sorted({round(steps * q / every) * every for q in (0.25, 0.5, 0.75, 1.0)})
    seeds = sorted({r["seed"] for r in rows})
    lines = [
        f"Validation loss (nats/char) after the same number of steps, mean ± std over seeds "
        f"{seeds}:",
        "",
        "| setting | " + " | ".join(f"step {m}" for m in marks) + " | statuses |",
        "|---|" + "---|" * len(marks) + "---|",
    ]
    for name in dict.fromkeys(r["setting"] for r in rows):
        runs = [r for r in rows if r["setting"] == name]
        cells = [fmt([dict(map(tuple, r["val_loss"])).get(m) for r in runs]) for m in marks]
        statuses = ", ".join(sorted({r["status"] for r in runs}))
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {statuses} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", nargs="*", help="setting names to run (default: all)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/pipeline_ordering.json"))
    ap.add_argument("--table", nargs="+", metavar="JSON", help="print the table of saved runs")
    args = ap.parse_args()
    if args.table:
        saved = [json.loads(Path(p).read_text()) for p in args.table]
        print(table([r for s in saved for r in s["runs"]], saved[0]["steps"]))
        return
    settings = {k: v for k, v in SETTINGS.items() if not args.only or k in args.only}
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [
            pool.submit(one, name, ov, seed, args.steps)
            for name, ov in settings.items()
            for seed in args.seeds
        ]
        rows = [f.result() for f in futures]
    Path(args.out).write_text(json.dumps({"steps": args.steps, "runs": rows}, indent=1) + "\n")
    print(table(rows, args.steps))


if __name__ == "__main__":
    main()
