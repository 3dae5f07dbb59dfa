"""stalebench on one GPU against plain PyTorch on the same GPU, in samples per second:
ResNet-20 (batch 128) and ResNet-50 (batch 64) on CIFAR-10-shaped images, not augmented
(generated in the real format; the `shape` dataset the paper sweeps give ResNet-50 holds no
values), each in precision fp32 and bf16 (autocast); one measurement of each arm, one process.

    python benchmarks/gpu.py                     # one GPU, sized for under 8 min on an H100
        # writes benchmarks/results/gpu.json, naming the GPU, CUDA and cuDNN
    python benchmarks/gpu.py --smoke [--out F]   # the CPU, in seconds: ResNet-20 at width 4,
        # batch 8, 1 and 2 workers, fp32; writes F only, nothing in benchmarks/results

The arms, for each model and precision:
- `plain`: forward, backward and `torch.optim.SGD` (`baselines.plain_loop`: same model, θ₀,
  data stream and autocast), after `baselines.WARMUP` steps;
- `real_1`, `real_2`, `real_4`: the real runtime, PS-ASP, 1, 2 or 4 worker processes
  sharing the GPU, θ on it (`server_device=auto`), each step as long as its compute
  (`cluster.compute_ms=0`), for SECONDS; the rate after each worker's first WARMUP updates,
  from events.jsonl (`benchmarks.__main__.stalebench_rate`);
- `real_1_cpu_server`: `real_1` with θ and its update on the CPU (`server_device=cpu`);
- `sim_batched`: the simulator, PS-ASP at 32 (ResNet-50: 16) workers, `sim.batch=on` (their
  pending gradients computed together): gradients over its own loop's seconds
  (`sim_throughput.sim`), after a short run that warms the same kernels up.
Targets (issue 69): real_1 ÷ plain ≥ 0.8 and sim_batched ÷ plain ≥ 0.8. Reported beside
them: real_2 and real_4 ÷ real_1 (workers sharing one GPU), real_1_cpu_server ÷ real_1.
Allreduce-BSP against DDP over NCCL needs two GPUs or more: not built, reported skipped.
An arm that fails is recorded with its error (the others still measured) and the exit
status is 1. Without CUDA the full mode refuses in one line.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import sim_throughput  # noqa: E402
from benchmarks.__main__ import stalebench_rate  # noqa: E402
from benchmarks.baselines import WARMUP, plain_loop  # noqa: E402
from benchmarks.sim_batch import cifar_files  # noqa: E402
from stalebench import placement  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "gpu.json"
SECONDS = 4.0  # of each real run (its clock: after every rank is set up)
SIM_ROUNDS = 20  # gradients per simulated worker in the timed simulation
TARGETS = {"real_1/plain": 0.8, "sim_batched/plain": 0.8}
# model -> (overrides, batch, plain loop's steps, simulated workers)
MODELS = {
    "resnet20": (["model=resnet20"], 128, 300, 32),  # 269,722 parameters at 10 classes
    "resnet50": (["model=resnet50"], 64, 150, 16),  # 23,528,522
}
SMOKE = {"resnet20": (["model=resnet20", "model.width=4"], 8, 4, 4)}


def arms(base: list[str], batch: int, steps: int, sim_workers: int, smoke: bool) -> dict:
    """name -> a thunk that measures that arm's samples/s, for the overrides `base` (a
    model, its data and precision)."""
    warmup = 2 if smoke else WARMUP

    def real(workers: int, server: str = "auto") -> float:
        updates = (warmup + steps) * workers if smoke else 0  # 0: budget.max_wall_s ends it
        budget = f"budget.max_wall_s={0 if smoke else SECONDS}"
        run = [*base, "algorithm=asp", f"cluster.num_workers={workers}", f"server_device={server}"]
        return batch * stalebench_rate([*run, budget], updates, warmup=warmup * workers)

    def sim() -> float:
        sim_throughput.sim(sim_workers, 2 * sim_workers, "on", base)  # the kernels, warmed up
        updates = (2 if smoke else SIM_ROUNDS) * sim_workers
        return batch * sim_throughput.sim(sim_workers, updates, "on", base)["events_per_s"]

    out = {"plain": lambda: batch * plain_loop(base, steps)}
    for n in (1, 2) if smoke else (1, 2, 4):
        out[f"real_{n}"] = lambda n=n: real(n)
    return {**out, "real_1_cpu_server": lambda: real(1, "cpu"), "sim_batched": sim}


def measure(label: str, thunks: dict) -> tuple[dict, dict]:
    """Each arm's samples/s, and the error of each that failed (its rate None): one arm's
    failure loses none of the others' figures."""
    rates, errors = {}, {}
    for name, thunk in thunks.items():
        try:
            rates[name] = thunk()
        except Exception as exc:  # noqa: BLE001 — recorded in the results and the exit status
            rates[name], errors[name] = None, f"{type(exc).__name__}: {exc}"
        shown = errors[name] if rates[name] is None else f"{rates[name]:,.1f} samples/s"
        print(f"{label} {name}: {shown}", flush=True)
    return rates, errors


def ratios(rates: dict) -> dict:
    pairs = [("real_1", "plain"), ("sim_batched", "plain"), ("real_2", "real_1"),
             ("real_4", "real_1"), ("real_1_cpu_server", "real_1")]  # fmt: skip
    return {
        f"{a}/{b}": rates[a] / rates[b] if rates[a] and rates[b] else None
        for a, b in pairs
        if a in rates
    }


def machine() -> dict:
    return {**placement.accelerator(), "torch": torch.__version__,
            "platform": platform.platform(), "python": platform.python_version()}  # fmt: skip


def table(figures: dict) -> str:
    num = lambda x, f: "failed" if x is None else format(x, f)  # noqa: E731
    lines = ["| model / precision | arm | samples/s | ÷ plain |", "|---|---|---:|---:|"]
    for name, fig in figures.items():
        rates = fig["samples_per_s"]
        for arm, rate in rates.items():
            ratio = rate / rates["plain"] if rate and rates["plain"] else None
            lines.append(f"| {name} | {arm} | {num(rate, ',.1f')} | {num(ratio, '.2f')} |")
    lines += ["", "| model / precision | ratio | value | target |", "|---|---|---:|---|"]
    for name, fig in figures.items():
        for key, value in fig["ratios"].items():
            target = f"≥ {TARGETS[key]}" if key in TARGETS else "—"
            lines.append(f"| {name} | {key} | {num(value, '.2f')} | {target} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/gpu.py")
    parser.add_argument("--smoke", action="store_true", help="the CPU, tiny runs: the wiring")
    parser.add_argument(
        "--out", type=Path, help="where the JSON goes (smoke: nowhere unless given)"
    )
    args = parser.parse_args()
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --smoke")
    started = time.perf_counter()
    device, models = ("cpu", SMOKE) if args.smoke else ("cuda", MODELS)
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = cifar_files(Path(tmp) / "cifar", per_file=64 if args.smoke else 1000)
        for model, (overrides, batch, steps, sim_workers) in models.items():
            for prec in ("fp32",) if args.smoke else ("fp32", "bf16"):
                base = [*overrides, "dataset=cifar10", f"dataset.root={data}",
                        "dataset.augment=false", f"dataset.batch_size={batch}",
                        f"device={device}", f"precision={prec}"]  # fmt: skip
                label = f"{model}/{prec}"
                rates, errors = measure(label, arms(base, batch, steps, sim_workers, args.smoke))
                figures[label] = {"samples_per_s": rates, "ratios": ratios(rates), "errors": errors}
    result = {
        "machine": machine(),
        "smoke": args.smoke,
        "device": device,
        "targets": TARGETS,
        "figures": figures,
        "skipped": {
            "allreduce_bsp/ddp_nccl": f"not built (2 GPUs or more; {placement.gpus()} here)"
        },
        "wall_s": time.perf_counter() - started,
    }
    skipped = "; ".join(f"{k}: {v}" for k, v in result["skipped"].items())
    print(f"\n{table(figures)}\n\n{result['wall_s']:.0f} s. Skipped: {skipped}")
    out = args.out or (None if args.smoke else RESULTS)
    if out is not None:
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"written to {out}")
    failed = [f"{name}/{arm}" for name, fig in figures.items() for arm in fig["errors"]]
    if failed:
        sys.exit(f"failed: {', '.join(failed)} (their errors are in the results)")


if __name__ == "__main__":
    main()
