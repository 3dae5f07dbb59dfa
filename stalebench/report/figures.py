"""Figures: convergence vs wall time, lag histograms, per-worker compute/wait/comm."""

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
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


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


def convergence(curves: pd.DataFrame, runs: pd.DataFrame, out: Path, metric: str) -> list[Path]:
    """Test ``metric`` (accuracy or loss) vs wall time of completed runs; a line per group
    (algorithm and settings), the band is ± std over seeds."""
    done = set(runs.loc[runs["status"] == "completed", "run_dir"])
    test = curves[(curves["split"] == "test") & curves["run_dir"].isin(done)].dropna(
        subset=[metric, "t"]
    )
    paths = []
    for title, suffix, sub in _settings(test):
        grid = np.linspace(0.0, float(sub["t"].max()), GRID_POINTS)
        fig, ax = plt.subplots(figsize=(6, 4))
        arms = _arms(sub)
        for color, arm in zip(sns.color_palette(n_colors=len(arms)), arms, strict=True):
            runs_of = sub[sub["arm"].astype(str) == arm]
            mean, std = band(runs_of, metric, grid)
            n = runs_of["run_dir"].nunique()
            ax.plot(grid, mean, color=color, label=f"{arm} (n={n})")
            ax.fill_between(grid, mean - std, mean + std, color=color, alpha=0.2, linewidth=0)
        ax.set(xlabel="wall time (s)", ylabel=f"test {metric}", title=title)
        ax.legend()
        paths.append(_save(fig, out / "figures" / f"test_{metric}_vs_time_{suffix}.png"))
    return paths


def lag_histograms(updates: pd.DataFrame, out: Path) -> list[Path]:
    """Distribution of update lag per group (all its runs, normalised per group)."""
    paths = []
    for title, suffix, sub in _settings(updates.dropna(subset=["lag"])):
        fig, ax = plt.subplots(figsize=(6, 4))
        sns.histplot(
            data=sub.assign(arm=sub["arm"].astype(str)),
            x="lag",
            hue="arm",
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


def worker_time(updates: pd.DataFrame, runs: pd.DataFrame, out: Path) -> list[Path]:
    """Per worker, total compute / wait / comm time in one run per group (the completed run
    with the lowest seed): a horizontal stacked bar per worker."""
    parts = ["compute_s", "wait_s", "comm_s"]
    colors = sns.color_palette(n_colors=3)
    ordered = runs.assign(_done=runs["status"] != "completed").sort_values(["_done", "seed"])
    paths = []
    for title, suffix, sub in _settings(updates):
        arms = _arms(sub)
        workers = sub["worker"].nunique()
        fig, axes = plt.subplots(
            len(arms),
            1,
            squeeze=False,
            sharex=True,
            figsize=(7, min(2 + len(arms) * (0.6 + 0.25 * min(workers, 32)), 30)),
        )
        for ax, arm in zip(axes[:, 0], arms, strict=True):
            candidates = ordered[
                ordered["run_dir"].isin(sub.loc[sub["arm"].astype(str) == arm, "run_dir"])
            ]
            run_dir = candidates["run_dir"].iloc[0]
            seed = candidates["seed"].iloc[0]
            per_worker = sub[sub["run_dir"] == run_dir].groupby("worker")[parts].sum().sort_index()
            left = np.zeros(len(per_worker))
            for part, color in zip(parts, colors, strict=True):
                values = per_worker[part].fillna(0).to_numpy(float)
                ax.barh(
                    np.arange(len(per_worker)),
                    values,
                    left=left,
                    color=color,
                    label=part.removesuffix("_s"),
                )
                left += values
            ax.set_yticks(np.arange(len(per_worker)), [str(w) for w in per_worker.index])
            ax.set(ylabel="worker", title=f"{arm} (seed {seed})")
            ax.invert_yaxis()
        axes[0, 0].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
        axes[-1, 0].set_xlabel("time (s)")
        fig.suptitle(f"Time per worker: {title}")
        paths.append(_save(fig, out / "figures" / f"worker_time_{suffix}.png"))
    return paths


def all_figures(
    runs: pd.DataFrame, curves: pd.DataFrame, updates: pd.DataFrame, out: Path
) -> list[Path]:
    out = Path(out)
    sns.set_theme(style="whitegrid")
    curves, updates = label_runs(runs, curves, updates)
    return [
        *convergence(curves, runs, out, "accuracy"),
        *convergence(curves, runs, out, "loss"),
        *lag_histograms(updates, out),
        *worker_time(updates, runs, out),
    ]
