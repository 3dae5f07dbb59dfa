"""Write a small table to try the plugin on: interleaved spirals, one per class, with noise.

    python -m stalebench_tabular.spirals DIR [--classes 3] [--turns 1] [--train 3000] [--test 600]

writes DIR/train.csv and DIR/test.csv (columns x1, x2, label), seeded (--seed)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def spirals(n: int, classes: int, turns: float, rng: np.random.Generator) -> np.ndarray:
    """n points (x1, x2, label): class c's arm is at angle 2π(turns·r + c/classes) at radius
    r ~ U(0.1, 1), with N(0, 0.2²) noise on the angle."""
    label = rng.integers(0, classes, size=n)
    r = rng.uniform(0.1, 1.0, size=n)
    angle = 2 * np.pi * (turns * r + label / classes) + rng.normal(0, 0.2, size=n)
    return np.column_stack([r * np.cos(angle), r * np.sin(angle), label])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--classes", type=int, default=3)
    p.add_argument("--train", type=int, default=3000)
    p.add_argument("--test", type=int, default=600)
    p.add_argument("--turns", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    a.dir.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", a.train), ("test", a.test)):
        table = spirals(n, a.classes, a.turns, rng)
        fmt = ["%.6f", "%.6f", "%d"]
        np.savetxt(a.dir / f"{split}.csv", table, fmt=fmt, delimiter=",",
                   header="x1,x2,label", comments="")  # fmt: skip
    print(f"wrote {a.dir}/train.csv ({a.train} rows) and {a.dir}/test.csv ({a.test} rows)")


if __name__ == "__main__":
    main()
