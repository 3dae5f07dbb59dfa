"""``stalebench-report DIR... [--out OUT]``: run directories → report.md, tables, figures."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from stalebench.metrics.summary import write_json
from stalebench.report import claims as claims_mod
from stalebench.report.collect import collect
from stalebench.report.groups import assign, load_configs
from stalebench.report.tables import (
    BASELINE,
    format_summary,
    summary_table,
    to_markdown,
    write_table,
)


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
    summary_md = write_table("summary", summary, format_summary(summary, baseline), out)
    write_table("runs", labelled, per_run_display(labelled, settings), out)
    figures = all_figures(labelled, curves, updates, out)
    verdicts = claims_mod.evaluate(runs, curves)

    n_done = int((runs["status"] == "completed").sum())
    lines = [
        "# stalebench report",
        "",
        f"Runs: {len(runs)} ({n_done} completed) from {', '.join(map(str, dirs))}.",
        "",
        "## Summary",
        "",
        "Mean ± sample std over the completed runs (seeds) of each group; runs that did not",
        "complete are counted in `runs` and listed under `not completed`. Time to target is",
        f"over the runs that reached it; speedup vs {baseline} = {baseline}'s mean time to",
        "target / the group's, same cluster and workers (and, where the baseline's groups",
        "differ in a setting, the same value of it). A group is every run with the same",
        "config but the seed; the columns between `workers` and `runs` are the settings",
        "that tell groups of one algorithm apart, and a cluster profile changed between",
        "runs names its changed keys, e.g. `heterogeneous[slowdown=1,1,3,3]`.",
        "",
        summary_md,
        "Tables: `tables/summary.csv`, `tables/summary.tex`, per run `tables/runs.csv`, "
        "`tables/runs.tex`.",
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
    lines += claim_section(verdicts, out)
    report = out / "report.md"
    report.write_text("\n".join(lines) + "\n")
    return report


def overrun_section(runs: pd.DataFrame) -> list[str]:
    """The real runs this machine could not run as the profile asked: more of their timed
    steps ran longer than drawn than summary.json's `overrun.limit` allows (none: no
    section)."""
    if "overrun_limit" not in runs:
        return []
    over = runs[runs["overrun_fraction"] > runs["overrun_limit"]]
    if over.empty:
        return []
    return ["", "## Runs that were not the cluster asked for", "",
            "This machine could not keep these real runs to their profile: their times are "
            "this machine's, not the cluster's (runtime=sim, fewer workers or a slower "
            "profile).", "",
            *(f"- `{row.run_dir}` — {row.algorithm}, seed {row.seed}: "
              f"{100 * row.overrun_fraction:.0f} % of its {row.overrun_steps:.0f} timed steps "
              f"ran longer than drawn (limit {100 * row.overrun_limit:.0f} %)"
              for row in over.itertuples())]  # fmt: skip


def per_run_display(runs: pd.DataFrame, settings: dict[str, str]) -> pd.DataFrame:
    """The per-run table as display strings: labels (the cluster as its profile), the
    settings that tell groups apart (by short name), seed, status and headline numbers."""
    head = {"run_dir": "run_dir", "algorithm": "algorithm", "profile": "cluster"}
    tail = [
        "seed",
        "status",
        "final_accuracy",
        "time_to_target_s",
        "lag_mean",
        "throughput_updates_per_s",
        "wall_time_s",
        "error",
    ]
    cols = {**head, "num_workers": "num_workers", **settings, **{c: c for c in tail}}
    shown = pd.DataFrame({name: runs[c] for c, name in cols.items() if c in runs})
    return shown.astype(object).where(shown.notna(), "—")


def claim_section(verdicts: list[dict], out: Path) -> list[str]:
    """The papers' claims with their verdicts (also written to out/claims.json)."""
    if not verdicts:
        (out / "claims.json").unlink(missing_ok=True)  # no stale verdicts from an earlier report
        return []
    write_json(
        out / "claims.json",
        {
            "rule": claims_mod.RULE,
            "alpha": claims_mod.ALPHA,
            "correction": claims_mod.CORRECTION,
            "claims": verdicts,
        },
    )
    lines = ["", "## Claims", "", f"Rule: {claims_mod.RULE}", ""]
    for sweep in dict.fromkeys(v["sweep"] for v in verdicts):
        first = next(v for v in verdicts if v["sweep"] == sweep)
        lines += [
            f"### {sweep} ({first['scale']}): {first['paper']}",
            "",
            f"Verdicts: {claims_mod.tally(verdicts, sweep)}.",
            "",
            to_markdown(claims_mod.table(verdicts, sweep)),
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
    except (LookupError, FileNotFoundError, claims_mod.ClaimError) as err:
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
