"""``stalebench-report DIR... [--out OUT]``: run directories → report.md, tables, figures."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from stalebench.metrics.summary import OLD_RUN_TIME, write_json
from stalebench.report import claim_judge, claim_metrics, claim_selection, claim_verdicts
from stalebench.report.collect import collect
from stalebench.report.groups import assign, load_configs
from stalebench.report.groups import display as groups_display
from stalebench.report.tables import (
    BASELINE,
    MISSING,
    baseline_note,
    format_summary,
    group_clock,
    one_clock,
    summary_table,
    to_markdown,
    write_table,
)
from stalebench.sweep import ALPHA


def build_report(
    dirs: list[str],
    out: Path,
    baseline: str = BASELINE,
    damaged: list[tuple[str, str]] | None = None,
) -> Path:
    """Write out/report.md, out/tables/*.{csv,tex}, out/figures/*.png; return report.md.
    A run whose events.jsonl is damaged is kept, and is listed in the report and in
    `damaged` as collect lists it: (run_dir, what is wrong). Raises LookupError when no
    run directory is found."""
    damaged = [] if damaged is None else damaged
    runs, curves, updates = collect(dirs, damaged)
    if runs.empty:
        raise LookupError(
            f"no run directory (summary.json or events.jsonl + .hydra/) under "
            f"{', '.join(map(str, dirs))}"
        )
    from stalebench.report.figures import all_figures  # matplotlib only when there is work

    out.mkdir(parents=True, exist_ok=True)
    configs = load_configs(runs["run_dir"])
    labelled, settings = assign(runs, configs)
    summary = summary_table(runs, baseline, configs)
    shown = format_summary(summary, baseline)
    summary_md = write_table("summary", summary, shown, out)
    note = baseline_note(summary, baseline) if f"speedup vs {baseline}" in shown else None
    # runs.csv says a run's length once, on its clock: not under the old key too
    write_table("runs", labelled.drop(columns=OLD_RUN_TIME, errors="ignore"),
                per_run_display(labelled, settings), out)  # fmt: skip
    claimed = claim_metrics.claim_targets(configs.values())  # the configs read above
    figures = all_figures(labelled, curves, updates, out, claimed)
    verdicts = claim_verdicts.evaluate(runs, curves)
    targets = target_section(labelled, settings, curves, claimed)

    n_done = int((runs["status"] == "completed").sum())
    lines = [
        "# stalebench report",
        "",
        f"Runs: {len(runs)} ({n_done} completed) from {', '.join(map(str, dirs))}.",
        "",
        "## Summary",
        "",
        "Mean ± sample std over the completed runs (seeds) of each group; runs that did not",
        "complete are counted in `runs` and listed under `not completed`. Times are on each",
        "run's clock: simulated seconds (runtime=sim) or real seconds (runtime=real), named in",
        "the column or, where rows differ, in `clock`. Time to target is over the runs that",
        f"reached it; speedup vs {baseline} = {baseline}'s mean time to target / the",
        "group's, same cluster and workers (and, where the baseline's groups",
        "differ in a setting, the same value of it). A group is every run with the same",
        "config but the seed; the columns between `workers` and `runs` are the settings",
        "that tell groups of one algorithm apart, and a cluster profile changed between",
        "runs names its changed keys, e.g. `heterogeneous[slowdown=1,1,3,3]`.",
        "",
        summary_md,
        *([note, ""] if note else []),
        "Tables: `tables/summary.csv`, `tables/summary.tex`, per run `tables/runs.csv`, "
        "`tables/runs.tex`.",
        *targets,
        "",
        "## Figures",
        "",
        *(f"![{p.stem}](figures/{p.name})\n" for p in figures),
        "",
        "## Runs that did not complete",
        "",
    ]
    bad = runs[runs["status"] != "completed"]
    if bad.empty:
        lines.append("None.")
    for row in bad.itertuples():
        error = getattr(row, "error", None) or "no error recorded"
        lines.append(
            f"- `{row.run_dir}` — {row.algorithm}, seed {row.seed}: **{row.status}** — {error}"
        )
    lines += overrun_section(runs)
    if damaged:  # kept above with what could be read: say what is missing
        lines += ["", "## Damaged event logs", ""]
        lines += [f"- `{run_dir}`: {what}" for run_dir, what in damaged]
    lines += tuning_section(dirs)
    lines += claim_section(verdicts, out, figures)
    report = out / "report.md"
    report.write_text("\n".join(lines) + "\n")
    return report


def target_section(
    labelled: pd.DataFrame, settings: dict[str, str], curves: pd.DataFrame, targets: list
) -> list[str]:
    """The summary's times to target read at the targets the sweep's claims use (a test
    loss for a regression sweep, which `budget.target_accuracy` never reaches), per group:
    the mean ± std over the completed runs that reached it, and how many did; the times as
    the claims read them (the first evaluation at or past the target)."""
    if not targets or labelled.empty:
        return []
    by_run = {d: c for d, c in curves.groupby("run_dir")} if not curves.empty else {}
    rows = []
    for _, group in labelled.groupby("group_index", sort=True):
        first = group.iloc[0]
        done = group[group["status"] == "completed"]
        row = {"algorithm": first["algorithm"], "cluster": first["profile"],
               "num_workers": first["num_workers"],
               **{name: groups_display(first[key]) for key, name in settings.items()},
               "clock": group_clock(group) or MISSING}  # fmt: skip
        for target in targets:
            times = [claim_metrics.first_reached(by_run.get(d), target) for d in done["run_dir"]]
            hit = [t for t in times if t is not None]
            spread = np.std(hit, ddof=1) if len(hit) > 1 else 0.0
            mean = f"{np.mean(hit):.3g} ± {spread:.2g}" if hit else "—"
            row[claim_metrics.target_label(target)] = f"{mean} ({len(hit)}/{len(done)})"
        rows.append(row)
    table = pd.DataFrame(rows)
    clock = one_clock(table["clock"])
    if clock:  # one clock: the line says it, not a column
        table = table.drop(columns="clock")
    unit = f"{clock} s" if clock else "s"
    return ["", f"Time to each target the claims use ({unit}; mean ± std of the runs that "
            "reached it, and how many of the completed runs did):", "",
            to_markdown(table)]  # fmt: skip


def tuning_section(dirs: list[str]) -> list[str]:
    """The tuning stage of each sweep directory among `dirs` (its tuning.json): what it
    selected on, and per cell every candidate tried — its values, its score (the mean of
    the selection metric over the tuning seeds), its standing and its runs' statuses —
    the selection (★), the points the extension added beyond the grid and why it stopped,
    and the cells whose selection is still at an edge of what was tried."""
    lines: list[str] = []
    for d in dirs:
        path = Path(d) / "tuning.json"
        if not path.is_file():
            continue
        t = json.loads(path.read_text())
        sel = t.get("select") or {}
        target = sel.get("target") or {}
        on = sel.get("metric", "?") + (
            f" ({target.get('split')} {target.get('key')} to {target.get('value')})"
            if target
            else ""
        )
        lines += ["", f"## Tuning ({path})", "",
                  f"Each cell's candidates ran on the validation split with seeds "
                  f"{', '.join(map(str, t.get('seeds', [])))}; selected on {on}, "
                  f"{sel.get('better', '?')} is better; a grid whose best point is at its edge "
                  f"is extended by its own ratio (at most {t.get('max_extensions', '?')} "
                  f"points) until the best is inside or the next point fails. Points tried per "
                  f"arm: {', '.join(f'{a} {p}' for a, p in (t.get('points') or {}).items())}.",
                  ""]  # fmt: skip
        rows = []
        for cell in t.get("cells", []):
            ext = cell.get("extension") or {}
            added = {a["candidate"] for a in ext.get("added", [])}
            for c in cell.get("candidates", []):
                statuses = [r.get("status", "?") for r in c.get("runs", [])]
                score = c.get("score")
                rows.append({
                    "cell": f"{cell.get('cell')} {cell.get('arm') or ''}".strip(),
                    "values": ", ".join(f"{k.rpartition('.')[2]}={v:g}" if isinstance(v, float)
                                        else f"{k.rpartition('.')[2]}={v}"
                                        for k, v in c.get("values", {}).items()),
                    "score": "—" if score is None else f"{score:.4g}",
                    "standing": c.get("standing", ""),
                    "runs": ", ".join(f"{s}×{statuses.count(s)}" for s in dict.fromkeys(statuses)),
                    "": " ★" if c.get("candidate") == cell.get("selected_candidate") else "",
                    "note": ("added beyond the grid" if c.get("candidate") in added else ""),
                })  # fmt: skip
            edge = ext.get("at_edge") or []
            stopped = ext.get("stopped")
            if edge or stopped:
                rows[-1]["note"] = "; ".join(filter(None, [
                    rows[-1]["note"],
                    f"extension stopped: {stopped}" if stopped else "",
                    f"selection at an edge of {', '.join(map(str, edge))}" if edge else "",
                ]))  # fmt: skip
        if rows:
            lines.append(to_markdown(pd.DataFrame(rows)))
    return lines


def overrun_section(runs: pd.DataFrame) -> list[str]:
    """The real runs this machine could not run as the profile asked: more of their timed
    steps ran longer than drawn, or more of their network waits woke late, than
    summary.json's `overrun.limit` allows (none: no section)."""
    if "overrun_limit" not in runs:
        return []
    late = runs.get("overrun_late_fraction", pd.Series(0.0, index=runs.index)).fillna(0.0)
    steps = runs["overrun_fraction"] > runs["overrun_limit"]
    waits = late > runs["overrun_limit"]
    if not (steps | waits).any():
        return []

    def why(row) -> str:
        i, parts = row.Index, []
        if steps[i]:
            parts.append(f"{100 * row.overrun_fraction:.0f} % of its {row.overrun_steps:.0f} "
                         "timed steps ran longer than drawn")  # fmt: skip
        if waits[i]:
            parts.append(f"{100 * late[i]:.0f} % of its {row.overrun_waits:.0f} network "
                         "waits woke late")  # fmt: skip
        return "; ".join(parts) + f" (limit {100 * row.overrun_limit:.0f} %)"

    return ["", "## Runs that were not the cluster asked for", "",
            "This machine could not keep these real runs to their profile: their times are "
            "this machine's, not the cluster's (runtime=sim, fewer workers or a slower "
            "profile).", "",
            *(f"- `{row.run_dir}` — {row.algorithm}, seed {row.seed}: {why(row)}"
              for row in runs.itertuples() if steps[row.Index] or waits[row.Index])]  # fmt: skip


def per_run_display(runs: pd.DataFrame, settings: dict[str, str]) -> pd.DataFrame:
    """The per-run table as display strings: labels (the cluster as its profile), the
    settings that tell groups apart (by short name), seed, status, the clock its times are
    on and headline numbers."""
    head = {"run_dir": "run_dir", "algorithm": "algorithm", "profile": "cluster"}
    tail = [
        "seed",
        "status",
        "clock",  # what time_to_target_s, throughput_updates_per_s and run_time_s are on
        "final_accuracy",
        "time_to_target_s",
        "lag_mean",
        "throughput_updates_per_s",
        "run_time_s",
        "error",
    ]
    cols = {**head, "num_workers": "num_workers", **settings, **{c: c for c in tail}}
    shown = pd.DataFrame({name: runs[c] for c, name in cols.items() if c in runs})
    return shown.astype(object).where(shown.notna(), "—")


# the figure that shows a claim's mechanism, by the start of its metric
FIGURE_OF = {
    "time_to_target": "test_loss_vs_time",
    "final_loss": "test_loss_vs_time",
    "final_accuracy": "test_accuracy_vs_time",
    "lag": "lag_histogram",
    "compute_fraction": "worker_time",
    "wait": "worker_time",
}


def figure_links(metric: str, figures: list[Path]) -> str:
    """Markdown links to the report's figures of a claim's metric (— when none shows it)."""
    stem = next((f for m, f in FIGURE_OF.items() if metric.startswith(m)), None)
    found = [p for p in figures if stem and p.stem.startswith(stem)]
    return ", ".join(f"[{p.stem.removeprefix(stem).strip('_') or stem}](figures/{p.name})"
                     for p in found) or "—"  # fmt: skip


def claim_section(verdicts: list[dict], out: Path, figures: list[Path] = ()) -> list[str]:
    """The papers' claims with their verdicts (also written to out/claims.json), each with
    links to the figures that show its metric."""
    if not verdicts:
        (out / "claims.json").unlink(missing_ok=True)  # no stale verdicts from an earlier report
        return []
    write_json(
        out / "claims.json",
        {
            "rule": claim_judge.RULE,
            "alpha": ALPHA,
            "correction": claim_judge.CORRECTION,
            "claims": verdicts,
        },
    )
    lines = ["", "## Claims", "", f"Rule: {claim_judge.RULE}", ""]
    for sweep in dict.fromkeys(v["sweep"] for v in verdicts):
        first = next(v for v in verdicts if v["sweep"] == sweep)
        lines += [
            f"### {sweep} ({first['scale']}): {first['paper']}",
            "",
            f"Verdicts: {claim_verdicts.tally(verdicts, sweep)}.",
            "",
            to_markdown(
                claim_verdicts.table(verdicts, sweep).assign(
                    figure=[
                        figure_links(v["metric"], list(figures))
                        for v in verdicts
                        if v["sweep"] == sweep
                    ]  # fmt: skip
                )
            ),
        ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="stalebench-report",
        description="Collect stalebench run directories into a Markdown report with tables "
        "and figures.",
    )
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="directories holding runs")
    parser.add_argument("--out", type=Path, help="output directory (default: the first DIR)")
    parser.add_argument(
        "--baseline",
        default=BASELINE,
        help=f"algorithm the speedups are relative to (default {BASELINE})",
    )
    args = parser.parse_args(argv)
    damaged: list[tuple[str, str]] = []
    try:
        report = build_report(args.dirs, args.out or Path(args.dirs[0]), args.baseline, damaged)
    except (LookupError, FileNotFoundError, claim_selection.ClaimError) as err:
        print(f"stalebench-report: error: {err}", file=sys.stderr)
        return 2
    finally:
        for run_dir, what in damaged:
            print(f"stalebench-report: warning: {run_dir}: {what}", file=sys.stderr)
    print(report)
    claims_json = report.parent / "claims.json"
    if claims_json.is_file():
        for v in json.loads(claims_json.read_text())["claims"]:
            where = f" [{v['scope']}]" if v["scope"] else ""
            published = f"  | published: {v['published']}" if v["published"] else ""
            print(
                f"{v['verdict']:>14}  {v['sweep']}/{v['id']}{where}: {v['ours'] or '—'}{published}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
