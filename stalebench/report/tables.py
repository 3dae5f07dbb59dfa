"""Summary tables: a row per group of runs, means ± std over seeds.

Runs are grouped by algorithm, cluster profile, workers and every other config value that
differs between them except the seed (stalebench.report.groups); each key that tells two
groups of one algorithm apart is a column of its own (`lr`, `engine`, ...). Accuracy,
time-to-target, lag and throughput are averaged over the *completed* runs of a group; runs
that failed, diverged or timed out stay in the table (``runs`` counts them and ``status``
lists them), they are never dropped silently. Std is the sample std (ddof=1).

Times are on each run's clock (`clock`: simulated seconds in runtime=sim, real seconds in
runtime=real), which the display names: in the column's name when every row has one
clock, else in a `clock` column per row.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from stalebench.metrics.events import CLOCKS
from stalebench.report import groups as groups_mod

GROUP = ["algorithm", "cluster", "num_workers"]
# The speedup baseline, matched case-insensitively against the ``algorithm`` column.
BASELINE = "BSP"
MISSING = "—"


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    if name in df:
        return pd.to_numeric(df[name], errors="coerce")
    return pd.Series(np.nan, index=df.index)


def _std(values: pd.Series) -> float:
    return float(values.std(ddof=1)) if len(values) > 1 else float("nan")


def summary_table(
    runs: pd.DataFrame, baseline: str = BASELINE, configs: dict[str, dict] | None = None
) -> pd.DataFrame:
    """One numeric row per group: algorithm, cluster (the profile's label), num_workers,
    the settings that tell groups apart (a column each, by short name), then the numbers.
    `configs`: run_dir → resolved config (default: each run's .hydra/config.yaml)."""
    labelled, settings = groups_mod.assign(runs, configs)
    rows = []
    for _, group in labelled.groupby("group_index", sort=True):
        first = group.iloc[0]
        done = group[group["status"] == "completed"]
        acc = _col(done, "final_accuracy").dropna()
        loss = _col(done, "final_loss").dropna()
        ttt = _col(done, "time_to_target_s").dropna()
        split, target = _target(done if len(done) else group)
        others = group.loc[group["status"] != "completed", "status"].fillna("unknown")
        rows.append(
            {
                "algorithm": first["algorithm"],
                "cluster": first["profile"],
                "num_workers": first["num_workers"],
                **{name: first[key] for key, name in settings.items()},
                "runs": len(group),
                "completed": len(done),
                "status": ", ".join(f"{s}×{n}" for s, n in sorted(others.value_counts().items())),
                "clock": group_clock(group),
                "final_accuracy_mean": float(acc.mean()) if len(acc) else float("nan"),
                "final_accuracy_std": _std(acc),
                "final_loss_mean": float(loss.mean()) if len(loss) else float("nan"),
                "final_loss_std": _std(loss),
                "time_to_target_mean": float(ttt.mean()) if len(ttt) else float("nan"),
                "time_to_target_std": _std(ttt),
                "target_split": split,
                "target_accuracy": target,
                "reached_target": len(ttt),
                "lag_mean": float(_col(done, "lag_mean").mean()),
                "throughput_updates_per_s": float(_col(done, "throughput_updates_per_s").mean()),
            }
        )
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table[f"speedup_vs_{baseline}"] = _speedups(table, baseline, list(settings.values()))
    return table


def group_clock(group: pd.DataFrame) -> str | None:
    """The clock of a group's times (None: unknown; its clocks joined by `/` in the rare
    group of runs without a config that are on different ones)."""
    clocks = sorted(set(group["clock"].dropna())) if "clock" in group else []
    return "/".join(clocks) or None


def _target(runs: pd.DataFrame) -> tuple[str | None, float]:
    """The accuracy target the runs' `time_to_target_s` is to, and the split it is read on
    (summary.json's `target_accuracy` and `eval_split`; a summary from before the split was
    recorded read the test split)."""
    target = _col(runs, "target_accuracy").dropna()
    if not len(target):
        return None, float("nan")
    split = runs["eval_split"].dropna() if "eval_split" in runs else pd.Series([], dtype=object)
    return (str(split.iloc[0]) if len(split) else "test"), float(target.iloc[0])


def _same(a, b) -> bool:
    return (pd.isna(a) and pd.isna(b)) if pd.isna(a) or pd.isna(b) else a == b


def _speedups(table: pd.DataFrame, baseline: str, settings: list[str]) -> list[float]:
    """Per row, the baseline's mean time to target / the row's: the baseline row of the same
    cluster and workers; where those baseline rows differ in settings, the one with the
    row's values of all of them. No ratio when no baseline row, or more than one, is left."""
    is_base = table["algorithm"].astype(str).str.lower() == baseline.lower()
    out = []
    for _, row in table.iterrows():
        same_cell = [
            _same(c, row["cluster"]) and _same(n, row["num_workers"])
            for c, n in zip(table["cluster"], table["num_workers"], strict=True)
        ]
        base = table[is_base & np.array(same_cell, dtype=bool)]
        keep = np.ones(len(base), dtype=bool)
        for name in settings:
            values = base[name].map(groups_mod.display)
            if values.nunique() > 1:
                keep &= (values == groups_mod.display(row[name])).to_numpy()
        base = base[keep]
        t = row["time_to_target_mean"]
        ok = len(base) == 1 and t > 0
        out.append(float(base["time_to_target_mean"].iloc[0]) / t if ok else float("nan"))
    return out


def _fmt(x, digits: int) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return MISSING
    return f"{x:.{digits}f}"


def _pm(mean: float, std: float, digits: int) -> str:
    if math.isnan(mean):
        return MISSING
    return _fmt(mean, digits) if math.isnan(std) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def format_summary(table: pd.DataFrame, baseline: str = BASELINE) -> pd.DataFrame:
    """The summary table as display strings (mean ± std, "—" when missing), the times named
    by their clock and the target by its split, metric and value (`reached test accuracy
    >= 0.6`; per row where rows differ in it). Runs with no accuracy at all (regression) and
    none at the accuracy target show no accuracy columns: no final accuracy, and no time to
    the accuracy target (budget.target_accuracy), which they can never reach."""
    speedup = f"speedup_vs_{baseline}"
    settings = list(table.columns[3 : table.columns.get_loc("runs")])
    shown = _format_summary(table, baseline, speedup, settings)
    if (
        len(table)
        and table["final_accuracy_mean"].isna().all()
        and not table["reached_target"].any()
    ):
        dropped = [c for c in shown if c.startswith(("time to target", "reached"))]
        shown = shown.drop(columns=["final test accuracy", *dropped, f"speedup vs {baseline}"])
    return shown


def target_text(split, target) -> str | None:
    """`test accuracy >= 0.6`: an accuracy target as the tables name it (None: none)."""
    if target is None or pd.isna(target):
        return None
    return f"{split if isinstance(split, str) else 'test'} accuracy >= {target:g}"


def _reached(table: pd.DataFrame) -> tuple[str, list[str]]:
    """The `reached` column's name and cells: how many of the completed runs reached the
    target, which the name says when every row has the same one, else each cell."""
    pairs = zip(table["target_split"], table["target_accuracy"], strict=True)
    targets = [target_text(split, target) for split, target in pairs]
    counts = [f"{r}/{c}" for r, c in zip(table["reached_target"], table["completed"], strict=True)]
    if len(set(targets)) == 1 and targets[0]:
        return f"reached {targets[0]}", counts
    return "reached", [f"{t}: {n}" if t else n for t, n in zip(targets, counts, strict=True)]


def _clocked(table: pd.DataFrame) -> tuple[str | None, dict[str, list[str]]]:
    """The clock every row's times are on (None: rows on different or unknown clocks), and
    the `clock` column that then says it per row (none when the names can)."""
    clock = one_clock(table["clock"])
    if clock:
        return clock, {}
    return None, {"clock": [c if isinstance(c, str) else MISSING for c in table["clock"]]}


def one_clock(clocks) -> str | None:
    """The clock all of `clocks` are (simulated, real), or None: they differ, or one is not
    known (None, or a group's `real/simulated`)."""
    found = {c if isinstance(c, str) else None for c in clocks}
    return found.pop() if len(found) == 1 and found <= set(CLOCKS.values()) else None


def baseline_note(table: pd.DataFrame, baseline: str = BASELINE) -> str | None:
    """One line under a summary table none of whose rows is the speedup's baseline (its
    speedup column is empty): the flag that names another. None when there is one."""
    names = table["algorithm"].astype(str) if len(table) else pd.Series([], dtype=str)
    if not len(names) or (names.str.lower() == baseline.lower()).any():
        return None
    others = ", ".join(dict.fromkeys(names))
    return (f"No {baseline} run here, so `speedup vs {baseline}` is empty: "
            f"`stalebench-report --baseline <algorithm>` measures the speedups against "
            f"another algorithm ({others}).")  # fmt: skip


def _format_summary(
    table: pd.DataFrame, baseline: str, speedup: str, settings: list[str]
) -> pd.DataFrame:
    clock, per_row = _clocked(table)
    unit, rate = (f"{clock} s", f"updates per {clock} s") if clock else ("s", "updates/s")
    reached, counts = _reached(table)
    return pd.DataFrame(
        {
            "algorithm": table["algorithm"].astype(str),
            "cluster": table["cluster"].astype(str),
            "workers": table["num_workers"].astype(str),
            **{name: table[name].map(groups_mod.display) for name in settings},
            "runs": table["runs"].astype(str),
            "completed": table["completed"].astype(str),
            "not completed": [s or MISSING for s in table["status"]],
            **per_row,
            "final test accuracy": [
                _pm(m, s, 3)
                for m, s in zip(
                    table["final_accuracy_mean"], table["final_accuracy_std"], strict=True
                )
            ],
            "final test loss": [
                _pm(m, s, 3)
                for m, s in zip(table["final_loss_mean"], table["final_loss_std"], strict=True)
            ],
            f"time to target ({unit})": [
                _pm(m, s, 2)
                for m, s in zip(
                    table["time_to_target_mean"], table["time_to_target_std"], strict=True
                )
            ],
            reached: counts,
            "mean lag": [_fmt(x, 2) for x in table["lag_mean"]],
            rate: [_fmt(x, 1) for x in table["throughput_updates_per_s"]],
            f"speedup vs {baseline}": [
                MISSING if math.isnan(x) else f"{x:.2f}×" for x in table[speedup]
            ],
        }
    )


def to_markdown(table: pd.DataFrame) -> str:
    """A GitHub Markdown table (no tabulate dependency)."""

    def cell(x) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    lines = [
        "| " + " | ".join(cell(c) for c in table.columns) + " |",
        "|" + "|".join("---" for _ in table.columns) + "|",
    ]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in table.itertuples(False)]
    return "\n".join(lines) + "\n"


_LATEX_ESCAPES = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "×": r"$\times$",
    "—": "---",
}


def _latex_escape(x) -> str:
    return "".join(_LATEX_ESCAPES.get(ch, ch) for ch in str(x))


def to_latex(table: pd.DataFrame) -> str:
    """A booktabs tabular (no jinja2 dependency)."""
    cols = "l" * len(table.columns)
    lines = [
        rf"\begin{{tabular}}{{{cols}}}",
        r"\toprule",
        " & ".join(_latex_escape(c) for c in table.columns) + r" \\",
        r"\midrule",
        *(" & ".join(_latex_escape(x) for x in row) + r" \\" for row in table.itertuples(False)),
        r"\bottomrule",
        r"\end{tabular}",
    ]
    return "\n".join(lines) + "\n"


def write_table(name: str, numeric: pd.DataFrame, display: pd.DataFrame, out: Path) -> str:
    """Write out/tables/<name>.csv (numeric) and <name>.tex (display); return the Markdown."""
    tables = Path(out) / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    numeric.to_csv(tables / f"{name}.csv", index=False)
    (tables / f"{name}.tex").write_text(to_latex(display))
    return to_markdown(display)
