"""Figures: convergence vs time, lag histograms, per-worker compute/wait/comm. Each is
written as PNG (embedded in report.md) and PDF (vector, for a paper) beside it; a figure
says what its band is, orders its arms as the summary table does (SSP(1), SSP(3),
SSP(10)), names the clock and unit of every time axis (simulated or real seconds), draws
the claims' targets, and puts a loss that spans more than a decade on a log scale."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from stalebench.report.groups import assign  # noqa: E402

GRID_POINTS = 200


def _slug(*parts) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", "_".join(str(p) for p in parts)).strip("-")
    if len(slug) > 80:  # a long profile label: cut, and keep it apart from its neighbours
        slug = slug[:64] + "-" + hashlib.sha1(slug.encode()).hexdigest()[:8]
    return slug


def _settings(df: pd.DataFrame):
    """(title, file suffix, rows) per (cluster profile, num_workers)."""
    for (profile, workers), sub in df.groupby(["profile", "num_workers"], dropna=False):
        yield f"{profile}, {workers} workers", _slug(profile, f"w{workers}"), sub


def _arms(sub: pd.DataFrame) -> list[str]:
    """The groups (algorithm and settings) in a figure, in the summary table's order."""
    return list(sub.sort_values("group_index")["arm"].astype(str).drop_duplicates())


def label_runs(runs: pd.DataFrame, *tables: pd.DataFrame) -> list[pd.DataFrame]:
    """`tables` (curves, updates) with each run's `profile`, `arm` and `group_index`, the
    grouping of stalebench.report.groups (computed here unless `runs` has it)."""
    if "arm" not in runs:
        runs = assign(runs)[0]
    labels = runs.set_index("run_dir")[["profile", "arm", "group_index"]]
    return [
        t.drop(columns=list(labels.columns), errors="ignore").join(labels, on="run_dir")
        for t in tables
    ]


def _save(fig, path: Path) -> Path:
    """`path` (PNG, 120 dpi) and the same figure as PDF beside it; returns the PNG's path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    fig.savefig(path.with_suffix(".pdf"))
    plt.close(fig)
    return path


def time_label(runs: pd.DataFrame, run_dirs, what: str = "time") -> str:
    """The time axis's name, by the clock of the runs drawn (collect's `clock`): simulated
    (virtual) time for simulator runs, real time for real ones; a figure whose runs are on
    different clocks, or on one not known, names them."""
    shown = runs.loc[runs["run_dir"].isin(set(run_dirs))]
    clocks = set(shown["clock"].fillna("unknown")) if "clock" in runs else {"unknown"}
    if clocks == {"unknown"}:
        return f"{what} (s; clock unknown)"
    if len(clocks) == 1:
        return f"{clocks.pop()} {what} (s)"
    return f"{what} (s; clocks differ: {', '.join(sorted(clocks))})"


# a loss whose plotted means span more than this factor is drawn on a log scale
LOG_SPAN = 10.0


def band(curves: pd.DataFrame, metric: str, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std over runs of ``metric`` interpolated on ``grid`` (each run only within
    the time span it covers; NaN where no run does)."""
    stack = []
    for _, run in curves.groupby("run_dir"):
        run = run[np.isfinite(run[metric].astype(float))].sort_values("t")
        if run.empty:
            continue
        t, y = run["t"].to_numpy(float), run[metric].to_numpy(float)
        values = np.interp(grid, t, y)
        values[(grid < t[0]) | (grid > t[-1])] = np.nan
        stack.append(values)
    if not stack:
        return np.full_like(grid, np.nan), np.full_like(grid, np.nan)
    stack = np.vstack(stack)
    counts = np.sum(~np.isnan(stack), axis=0)
    with np.errstate(all="ignore"):
        mean = np.where(counts > 0, np.nansum(stack, axis=0) / np.maximum(counts, 1), np.nan)
        var = np.nansum((stack - mean) ** 2, axis=0) / np.maximum(counts - 1, 1)
    return mean, np.where(counts > 1, np.sqrt(var), 0.0)


def convergence(
    curves: pd.DataFrame, runs: pd.DataFrame, out: Path, metric: str, targets=()
) -> list[Path]:
    """Test ``metric`` (accuracy or loss) vs time of completed runs; a line per group
    (algorithm and settings), the band ± one sample std over its seeds (n in the legend);
    `targets` (the claims' (split, key, value)) on the test split of this metric drawn as
    dashed lines."""
    done = set(runs.loc[runs["status"] == "completed", "run_dir"])
    test = curves[(curves["split"] == "test") & curves["run_dir"].isin(done)].dropna(
        subset=[metric, "t"]
    )
    paths = []
    for title, suffix, sub in _settings(test):
        grid = np.linspace(0.0, float(sub["t"].max()), GRID_POINTS)
        fig, ax = plt.subplots(figsize=(6, 4))
        arms = _arms(sub)
        lows, highs = [], []
        for color, arm in zip(sns.color_palette(n_colors=len(arms)), arms, strict=True):
            runs_of = sub[sub["arm"].astype(str) == arm]
            mean, std = band(runs_of, metric, grid)
            n = runs_of["run_dir"].nunique()
            ax.plot(grid, mean, color=color, label=f"{arm} (n={n})")
            ax.fill_between(grid, mean - std, mean + std, color=color, alpha=0.2, linewidth=0)
            finite = mean[np.isfinite(mean) & (mean > 0)]
            if finite.size:
                lows.append(finite.min())
                highs.append(finite.max())
        for t in targets:
            if t.split == "test" and t.key == metric:
                ax.axhline(t.value, color="0.3", linestyle="--", linewidth=1,
                           label=f"target {t.value:g}")  # fmt: skip
        if metric == "loss" and lows and max(highs) / min(lows) > LOG_SPAN:
            ax.set_yscale("log")
        ax.set(xlabel=time_label(runs, sub["run_dir"]), ylabel=f"test {metric}", title=title)
        ax.legend(title="band: ± 1 std over seeds", title_fontsize="small", fontsize="small")
        paths.append(_save(fig, out / "figures" / f"test_{metric}_vs_time_{suffix}.png"))
    return paths


def lag_histograms(updates: pd.DataFrame, out: Path) -> list[Path]:
    """Distribution of update lag per group (all its runs, normalised per group)."""
    paths = []
    for title, suffix, sub in _settings(updates.dropna(subset=["lag"])):
        fig, ax = plt.subplots(figsize=(6, 4))
        sns.histplot(  # the legend names its groups "algorithm", as the other figures do
            data=sub.assign(algorithm=sub["arm"].astype(str)),
            x="lag",
            hue="algorithm",
            hue_order=_arms(sub),
            discrete=True,
            stat="probability",
            common_norm=False,
            element="step",
            ax=ax,
        )
        ax.set(xlabel="lag (versions)", ylabel="fraction of updates", title=title)
        paths.append(_save(fig, out / "figures" / f"lag_histogram_{suffix}.png"))
    return paths


# the worker-time figure's height at most (inches; 1,200 px at 120 dpi)
MAX_HEIGHT = 10.0


def worker_time(updates: pd.DataFrame, runs: pd.DataFrame, out: Path) -> list[Path]:
    """Per worker, its compute / wait / comm time per run, the mean over the group's
    completed runs (seeds): a horizontal stacked bar per worker, the figure no taller than
    MAX_HEIGHT (bars thinner as workers grow)."""
    parts = ["compute_s", "wait_s", "comm_s"]
    colors = sns.color_palette(n_colors=3)
    done = set(runs.loc[runs["status"] == "completed", "run_dir"])
    paths = []
    for title, suffix, sub in _settings(updates):
        arms = _arms(sub)
        workers = sub["worker"].nunique()
        fig, axes = plt.subplots(
            len(arms), 1, squeeze=False, sharex=True,
            figsize=(7, min(2 + len(arms) * (0.6 + 0.25 * min(workers, 32)), MAX_HEIGHT)),
        )  # fmt: skip
        for ax, arm in zip(axes[:, 0], arms, strict=True):
            mine = sub[sub["arm"].astype(str) == arm]
            pooled = mine[mine["run_dir"].isin(done)] if mine["run_dir"].isin(done).any() else mine
            n = pooled["run_dir"].nunique()
            per_run = pooled.groupby(["run_dir", "worker"])[parts].sum()
            per_worker = per_run.groupby("worker").mean().sort_index()
            left = np.zeros(len(per_worker))
            for part, color in zip(parts, colors, strict=True):
                values = per_worker[part].fillna(0).to_numpy(float)
                ax.barh(np.arange(len(per_worker)), values, left=left, color=color,
                        label=part.removesuffix("_s"))  # fmt: skip
                left += values
            ticks = np.arange(len(per_worker))
            step = max(1, len(ticks) // 16)  # at most ~16 labels
            ax.set_yticks(ticks[::step], [str(w) for w in per_worker.index[::step]])
            ax.set(ylabel="worker", title=f"{arm} (mean of {n} seed{'s' if n > 1 else ''})")
            ax.invert_yaxis()
        axes[0, 0].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
        axes[-1, 0].set_xlabel(time_label(runs, sub["run_dir"], "time per run"))
        fig.suptitle(f"Time per worker: {title}")
        paths.append(_save(fig, out / "figures" / f"worker_time_{suffix}.png"))
    return paths


def all_figures(
    runs: pd.DataFrame, curves: pd.DataFrame, updates: pd.DataFrame, out: Path, targets=()
) -> list[Path]:
    out = Path(out)
    sns.set_theme(style="whitegrid")
    curves, updates = label_runs(runs, curves, updates)
    return [
        *convergence(curves, runs, out, "accuracy", targets),
        *convergence(curves, runs, out, "loss", targets),
        *lag_histograms(updates, out),
        *worker_time(updates, runs, out),
    ]
