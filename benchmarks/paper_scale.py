"""Paper scale, measured: for each `_full` sweep, the simulator's cost per server update on
this machine, measured over a few hundred events at the sweep's smallest and largest number
of workers, one gradient at a time and batched, and the projected wall time of the whole
sweep (every run of its tuning protocol, with its evaluations).

    python benchmarks/paper_scale.py [--updates 200] [--only dana]
    # writes benchmarks/results/paper_scale.json and prints the table

A sweep's runs: its grid's cells (every combination of its parameters but the seed) × (the
tuning grid's points × the tuning seeds + the final seeds): the least it runs; at most,
every grid extended as far as `sweep.tune.max_extensions` allows and every cell to the
second stage's `max_seeds` (`projected_hours_most`). A run's cost: its budget's gradients —
its own cell's updates per virtual second (measured per cell: ASP makes N× BSP's updates at
one N, each of one gradient where BSP's is of N) × the budget's virtual seconds × its
gradients per update — × the measured seconds per gradient (batched: the cell's own short
run; one at a time: measured at the smallest and largest N of the cells that share its
model and data, interpolated linearly in N between them) + its evaluations × the measured
seconds of one evaluation of that model's held-out split. The data is generated in the
datasets' real formats (CIFAR-10 python batches, MNIST IDX) at their real sizes, so a
gradient and an evaluation cost what they would. A sweep whose runtime is `real` (its
workers are processes on their own devices) is projected from the simulator's cost; one
that cannot be composed on its own (a pipeline sweep whose arms each bring their model) is
listed with the reason it was skipped.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import math
import os
import pickle
import platform
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stalebench import experiment  # noqa: E402
from stalebench.data.cifar import TEST_FILE, TRAIN_FILES  # noqa: E402
from stalebench.job import Job  # noqa: E402
from stalebench.sweep import grid_points  # noqa: E402
from tests.conftest import compose  # noqa: E402

FULL = sorted(p.stem for p in (ROOT / "stalebench" / "conf" / "sweep").glob("*_full.yaml"))


def hydra_config(sweep: str, extra: list[str]):
    """The sweep's composed config with its `hydra:` node (its sweeper's params)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from stalebench.config import register_configs
    from stalebench.plugins import load as load_plugins

    load_plugins()
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module("stalebench.conf", version_base=None):
            return hydra_compose(
                "config", overrides=[f"+sweep={sweep}", *extra], return_hydra_config=True
            )
    finally:
        GlobalHydra.instance().clear()


def plan(sweep: str, extra: list[str]) -> dict:
    """The sweep's cells (each its overrides), seeds and tuning runs per cell."""
    cfg = hydra_config(sweep, extra)
    params = {k: str(v).split(",") for k, v in cfg.hydra.sweeper.params.items()}
    seeds = params.pop("seed", ["0"])
    keys = list(params)
    cells = [dict(zip(keys, values, strict=True)) for values in itertools.product(*params.values())]
    tune = cfg.sweep.get("tune") or {}
    points = grid_points(dict(tune.get("params") or {}), "sweep.tune.params") if tune else 1
    tune_seeds = len(tune.get("seeds", [1000, 1001]))
    tuning = points * tune_seeds if tune.get("params") else 0
    extended = (points + int(tune.get("max_extensions", 4))) * tune_seeds if tuning else 0
    sequential = cfg.sweep.get("sequential") or {}
    most = max(len(seeds), int(sequential.get("max_seeds", 0) or 0))
    return {"cells": cells, "seeds": len(seeds), "tuning_runs_per_cell": tuning,
            # the most a cell can run: every grid extended as far as allowed, and every
            # seed of the second stage (sweep.sequential.max_seeds)
            "most_runs_per_cell": extended + most}  # fmt: skip


def cell_overrides(cell: dict) -> list[str]:
    return [f"{k}={v}" for k, v in cell.items()]


def workers_of(job_cfg) -> int:
    return int(job_cfg.cluster.num_workers)


def what_computes(job_cfg) -> tuple[str, str]:
    """What a gradient's cost depends on besides N: the model and the data (its batch)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(job_cfg.model), OmegaConf.to_yaml(job_cfg.dataset)


def measure(sweep: str, cell: dict, extra: list[str], updates: int, batch: str) -> dict:
    """Seconds per update of a short simulated run of this cell (no evaluations), and of one
    evaluation of its held-out split."""
    over = [f"+sweep={sweep}", *cell_overrides(cell), *extra]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose(
            [
                *over,
                "runtime=sim",
                f"budget.max_updates={updates}",
                "budget.max_wall_s=0",
                "eval.every_updates=0",
                "eval.every_s=0",
                "eval.train_samples=0",
                # the end's evaluation on a small split: an evaluation is measured apart
                "eval.split=val",
                "eval.validation_fraction=0.05",  # every class in it (mnist1d: 200)
                "logger=none",
                f"sim.batch={batch}",
            ]  # fmt: skip
        )
        cfg.run_dir = tmp
        summary = experiment.run(cfg)
    per_update = summary["sim_loop_s"] / max(summary["updates"], 1)
    gradients = summary.get("gradients") or summary["updates"]
    return {
        "updates": summary["updates"],
        "updates_per_virtual_s": summary["updates"] / max(summary["run_time_s"], 1e-9),
        "gradients": summary.get("gradients"),
        "gradients_per_update": gradients / max(summary["updates"], 1),
        "s_per_update": per_update,
        # what a run costs goes with its gradients (a BSP update is N of them, ASP's one)
        "s_per_gradient": summary["sim_loop_s"] / max(gradients, 1),
        "status": summary["status"],
        "sim_batch": summary.get("sim_batch"),
    }


def eval_seconds(sweep: str, cell: dict, extra: list[str]) -> float:
    """One evaluation of θ₀ on the sweep's held-out split, as the run's evaluator does it:
    on the run's device (`Job.device`: the GPU where there is one)."""
    from stalebench.evaluation import evaluate

    cfg = compose([f"+sweep={sweep}", *cell_overrides(cell), *extra, "runtime=sim"])
    job = Job.build(cfg)
    device = job.device(0)
    model = job.model().to(device)
    params = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    s = job.splits
    evaluate(model, params, s.x_test[:1000], s.y_test[:1000], 1000)  # warm-up (kernels)
    start = time.perf_counter()
    evaluate(model, params, s.x_test, s.y_test, 1000)  # its result read back: synchronised
    return time.perf_counter() - start


def write_cifar(root: Path) -> Path:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    for name in [*TRAIN_FILES, TEST_FILE]:
        batch = {b"labels": rng.integers(0, 10, 10000).tolist(),
                 b"data": rng.integers(0, 256, size=(10000, 3072), dtype=np.uint8)}  # fmt: skip
        (root / name).write_bytes(pickle.dumps(batch, protocol=2))
    return root


def write_mnist(root: Path) -> Path:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", 60000), ("t10k", 10000)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        with gzip.open(root / f"{prefix}-images-idx3-ubyte.gz", "wb") as f:
            f.write(struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
        with gzip.open(root / f"{prefix}-labels-idx1-ubyte.gz", "wb") as f:
            f.write(struct.pack(">II", 2049, n) + labels.tobytes())
    return root


def data_overrides(sweep: str, cell: dict, data: Path) -> list[str]:
    """The generated files' folder for a cell whose dataset reads files."""
    cfg = hydra_config(sweep, cell_overrides(cell))
    name = cfg.dataset.name
    if name == "cifar10":
        return [f"dataset.root={data / 'cifar'}"]
    if name == "mnist":
        return [f"dataset.root={data / 'mnist'}"]
    return []


def hours(seconds: float) -> float:
    return round(seconds / 3600, 1)


def project(sweep: str, data: Path, updates: int) -> dict:
    p = plan(sweep, [])
    cells = [{**cell, **dict(o.split("=", 1) for o in data_overrides(sweep, cell, data))}
             for cell in p["cells"]]  # fmt: skip
    extra: list[str] = []
    runs_per_cell = p["tuning_runs_per_cell"] + p["seeds"]
    configs = [compose([f"+sweep={sweep}", *cell_overrides(cell), *extra]) for cell in cells]
    ns = sorted({workers_of(cfg) for cfg in configs})
    # a gradient's cost is its model's on its data: cells are grouped by the two (psp_full
    # pairs a CNN on MNIST at 6 workers with a logistic regression at 50 and 200), and one
    # at a time is measured at each group's ends in N, interpolated only within a group
    # (interpolating from the CNN to the regression priced a regression's gradient at
    # 50 workers as 12 ms, about 35x its own)
    group = [what_computes(cfg) for cfg in configs]
    ends: dict[tuple, dict[int, int]] = {}
    for i, (key, cfg) in enumerate(zip(group, configs, strict=True)):
        ends.setdefault(key, {}).setdefault(workers_of(cfg), i)
    ends = {key: {n: by_n[n] for n in (min(by_n), max(by_n))} for key, by_n in ends.items()}
    # every cell's own short run, batched: its rate and its cost per gradient
    cell_rates = [measure(sweep, cell, extra, updates, "auto") for cell in cells]
    off = {key: {n: measure(sweep, cells[i], extra, updates, "off") for n, i in by_n.items()}
           for key, by_n in ends.items()}  # fmt: skip
    # one evaluation of each group's held-out split (a CNN's on MNIST is not a regression's)
    evaluation = {key: eval_seconds(sweep, cells[next(iter(by_n.values()))], extra)
                  for key, by_n in ends.items()}  # fmt: skip
    # updates per virtual second differ by arm (ASP makes N× BSP's at one N, each of one
    # gradient where BSP's is of N), so every cell's own short run sets its budget's
    # gradients; the CPU per gradient is the cell's own batched, its group's ends' one at a
    # time (per_gradient, below)

    budgets = []
    for cfg, r in zip(configs, cell_rates, strict=True):
        b, e, n = cfg.budget, cfg.eval, workers_of(cfg)
        by_wall = b.max_wall_s * r["updates_per_virtual_s"] if b.max_wall_s else math.inf
        run_updates = min(b.max_updates or math.inf, by_wall)
        evals = (
            run_updates / e.every_updates
            if e.every_updates
            else (b.max_wall_s / e.every_s if e.every_s and b.max_wall_s else 0)
        )
        budgets.append((n, run_updates, run_updates * r["gradients_per_update"], evals,
                        cfg.runtime))  # fmt: skip

    def per_gradient(mode: str, i: int) -> float:
        if mode == "auto":  # the cell's own
            return cell_rates[i]["s_per_gradient"]
        by_n, n = off[group[i]], budgets[i][0]
        (lo_n, lo), (hi_n, hi) = min(by_n.items()), max(by_n.items())
        w = (n - lo_n) / (hi_n - lo_n) if hi_n > lo_n else 0.0
        return (1 - w) * lo["s_per_gradient"] + w * hi["s_per_gradient"]

    def total(mode: str, runs: int) -> float:
        return sum(
            runs * (grads * per_gradient(mode, i) + evals * evaluation[group[i]])
            for i, (_, _, grads, evals, _) in enumerate(budgets)
        )

    modes = ("off", "auto")
    totals = {mode: total(mode, runs_per_cell) for mode in modes}
    most = {mode: total(mode, p["most_runs_per_cell"]) for mode in modes}
    return {
        "runs": len(cells) * runs_per_cell,
        "most_runs": len(cells) * p["most_runs_per_cell"],
        "cells": len(cells),
        "runtime": sorted({b[4] for b in budgets}),
        "updates_per_run": sorted({round(b[1]) for b in budgets}),
        "workers": ns,
        "eval_s": max(evaluation.values()),  # the dearest group's
        # each group's ends in N, one at a time and batched (a sweep of one model: one group)
        "groups": [
            {
                "off": {str(n): v for n, v in off[key].items()},
                "auto": {str(n): cell_rates[i] for n, i in by_n.items()},
                "eval_s": evaluation[key],
                "cells": group.count(key),
            }
            for key, by_n in ends.items()
        ],
        "projected_hours": {m: hours(t) for m, t in totals.items()},
        # every grid extended as far as allowed and every cell to the second stage's last
        # look: what the sweep can cost at most
        "projected_hours_most": {m: hours(t) for m, t in most.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/paper_scale.py")
    parser.add_argument("--updates", type=int, default=200, help="measured per cell end")
    parser.add_argument("--only", default="", help="these sweeps (comma-separated names)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        write_cifar(data / "cifar")
        write_mnist(data / "mnist")
        only = set(filter(None, args.only.split(",")))
        for sweep in FULL:
            if not only or sweep in only:
                try:
                    out[sweep] = project(sweep, data, args.updates)
                except Exception as exc:  # noqa: BLE001 (a sweep that cannot be measured here)
                    out[sweep] = {"skipped": f"{type(exc).__name__}: {str(exc)[:300]}"}
                print(sweep, json.dumps(out[sweep].get("projected_hours", out[sweep])))
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "torch": torch.__version__,
                    "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None},
        "updates_measured": args.updates,
        "sweeps": out,
    }  # fmt: skip
    name = "paper_scale" + ("_cuda" if torch.cuda.is_available() else "")
    out_path = ROOT / "benchmarks" / "results" / f"{name}.json"
    if only and out_path.is_file():  # --only: the other sweeps' entries are kept
        kept = json.loads(out_path.read_text()).get("sweeps", {})
        result["sweeps"] = {**kept, **out}
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    print("\n| sweep | runs | workers | updates/run | s/update (N ends, one at a time → batched) "
          "| eval s | hours, one at a time | hours, batched |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for sweep, r in out.items():
        if "skipped" in r:
            print(f"| {sweep} | skipped: {r['skipped'].splitlines()[0]} |")
            continue
        ends = "; ".join(  # each group of cells (model and data) at its ends in N
            ", ".join(
                f"N={n}: {g['off'][n]['s_per_update'] * 1e3:.1f} → "
                f"{g['auto'][n]['s_per_update'] * 1e3:.1f} ms"
                for n in g["off"]
            )
            for g in r["groups"]
        )
        print(
            f"| {sweep} | {r['runs']} | {r['workers'][0]}–{r['workers'][-1]} "
            f"| {', '.join(map(str, r['updates_per_run']))} | {ends} | {r['eval_s']:.2f} "
            f"| {r['projected_hours']['off']} | {r['projected_hours']['auto']} |"
        )


if __name__ == "__main__":
    main()
