"""A saved sweep's files under results/<sweep>/: `save` writes claims.json (the verdicts with
their provenance and tuning.json's selection) and runs.csv (one row per run, every number the
claims read from it); `load` reads every committed claims.json back, checked against the
schema."""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
from pathlib import Path
from typing import Any

import pandas as pd

from stalebench.metrics.summary import write_json
from stalebench.report import claim_judge, claim_metrics, claim_selection
from stalebench.report.collect import collect
from stalebench.report.groups import assign
from stalebench.report.provenance import _yaml, portable, provenance
from stalebench.report.results_schema import _NAME, ClaimsFileError, read_claims
from stalebench.tuning import FILE as TUNING  # <sweep_dir>/tuning.json: the selection
from stalebench.tuning import STAGE_DIR as TUNE_DIR  # <sweep_dir>/tune/: its runs

RESULTS = "results"  # results/<sweep>/claims.json, in the checkout


def save(sweep_dir: Path, root: Path, command: str | None = None) -> list[Path]:
    """results/<sweep>/claims.json for each sweep whose verdicts <sweep_dir>/claims.json
    holds; returns the files written."""
    sweep_dir = Path(sweep_dir)
    source = sweep_dir / "claims.json"
    if not source.is_file():
        raise FileNotFoundError(
            f"no claims.json in {sweep_dir}: not a paper sweep, or run `stalebench-report "
            f"{sweep_dir}` first"
        )
    data = read_claims(source)
    verdicts = data["claims"]
    names = list(dict.fromkeys(v["sweep"] for v in verdicts))
    for name in names:
        if not _NAME.match(name):
            raise ValueError(f"{source}: sweep name {name!r} cannot name a directory")
    tuning_path = sweep_dir / TUNING
    tuning = json.loads(tuning_path.read_text()) if tuning_path.is_file() else None
    prov = provenance(sweep_dir, root, command)
    tables = runs_tables(sweep_dir)
    written = []
    for name in names:
        out = Path(root) / RESULTS / name / "claims.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        payload = {k: v for k, v in data.items() if k != "claims"}
        payload["claims"] = [v for v in verdicts if v["sweep"] == name]
        payload["provenance"] = prov
        if tuning is not None:
            payload["tuning"] = tuning
        if name in tables:
            payload["sweep_config"] = tables[name][1]
        write_json(out, payload)
        written.append(out)
        runs_csv = out.parent / RUNS
        if name in tables:
            write_runs(runs_csv, tables[name][0])
            written.append(runs_csv)
        else:  # no run's config names the sweep: an earlier save's table is not of these runs
            runs_csv.unlink(missing_ok=True)
    return written


# results/<sweep>/runs.csv: one row per run, every number the sweep's claims read from it.
# CSV rather than JSON lines: the column names once in a header rather than on every line,
# one line a run (a diff names the run), and read by any spreadsheet, pandas or `csv`;
# floats are written as Python's repr, which reads back to the same double.
RUNS = "runs.csv"
TUNING_STAGE = "tuning"  # a run of the tuning stage; the others `final` (look 1) or `look<k>`
CENSORED = " censored"  # beside a time to target: never reached, the value is the run's end
# the kinds judged by a test of each run's `metric` (the count kinds read status, or a value)
TESTED_KINDS = ("ordering", "ratio", "threshold", "gap_closed", "trend")


def _measures(claims: list[Any]) -> list[tuple[str, Any]]:
    """(column, the claim whose `metric` computes it) for every number the claims read from
    a run: a test's metric (a time to target per target, with its censoring), a reproduced
    metric, and a fails claim's final accuracy and chance accuracy (chance: None, read as
    the summary records it)."""
    out: dict[str, Any] = {}
    for claim in claims:
        if claim.kind in TESTED_KINDS and claim.metric == "time_to_target":
            out.setdefault(claim_metrics.target_label(claim.target), claim)
        elif claim.kind in (*TESTED_KINDS, "reproduces"):
            out.setdefault(claim.metric, dataclasses.replace(claim, target=None))
        elif claim.kind == "fails":
            out.setdefault("final_accuracy", dataclasses.replace(claim, metric="final_accuracy"))
            out.setdefault("chance_accuracy", None)
    return list(out.items())


def _selector_keys(claims: list[Any]) -> list[str]:
    """Every key a claim selects runs by (its sides and `where`) or splits them on (`per`,
    `over`), in the order the claims name them."""
    keys: dict[str, None] = {}
    for claim in claims:
        for selector in (claim.where, claim.a, claim.b, claim.c):
            keys.update(dict.fromkeys(selector))
        keys.update(dict.fromkeys(k for k in (claim.per, claim.over) if k))
    return list(keys)


def _scalar(x: Any) -> Any:
    """A table cell: a list or mapping as JSON, a NaN as empty."""
    if isinstance(x, list | dict):
        return json.dumps(x, sort_keys=True)
    return None if isinstance(x, float) and math.isnan(x) else x


def _overrides(run: Path) -> str:
    job = _yaml(run / ".hydra" / "overrides.yaml")
    return " ".join(shlex.quote(portable(str(o))) for o in job) if isinstance(job, list) else ""


def _stage(row: dict[str, Any]) -> str:
    k = claim_judge.look(row)
    return "final" if k == 1 else f"look{k}"


def runs_tables(sweep_dir: Path) -> dict[str, tuple[pd.DataFrame, dict[str, Any]]]:
    """Per sweep found in the runs' configs: its per-run table and its `sweep` block (the
    claims and second stage, as the runs' configs resolve them). A row per run: its
    directory under the sweep's, stage, arm (the report's group label), seed, status
    (diverged where the evaluator finds a blow-up the summary missed, `diverged_why` saying
    why), the keys the claims select by, every number the claims read as the evaluator's
    `metric` computes it (empty where it finds none), and the run's overrides. The runs the
    evaluator judges are the report's (the tuning stage left out beside a tuning.json),
    in its order; the tuning stage's follow, judged by no claim."""
    sweep_dir = Path(sweep_dir)
    damaged: list[tuple[str, str]] = []  # read as the report reads them; named there
    runs, curves, _ = collect([sweep_dir], damaged)
    rows, sweeps = claim_selection.claim_rows(runs) if not runs.empty else ([], {})
    claim_metrics.mark_blow_ups(rows, curves)
    stage_dir = sweep_dir / TUNE_DIR
    tuning_rows: list[dict[str, Any]] = []
    if (sweep_dir / TUNING).is_file() and stage_dir.is_dir():
        more, more_curves, _ = collect([stage_dir], damaged)
        if not more.empty:
            tuning_rows, _ = claim_selection.claim_rows(more)
            claim_metrics.mark_blow_ups(tuning_rows, more_curves)
            runs = pd.concat([runs, more], ignore_index=True)
            curves = pd.concat([curves, more_curves], ignore_index=True)
    if not sweeps:
        return {}
    arms = dict(zip(*(assign(runs)[0][k] for k in ("run_dir", "group")), strict=True))
    staged = [(r, _stage(r)) for r in rows] + [(r, TUNING_STAGE) for r in tuning_rows]
    tables = {}
    for name, sweep in sweeps.items():
        keys, measures = _selector_keys(sweep["claims"]), _measures(sweep["claims"])
        table = []
        for row, stage in staged:
            if row["sweep"] != name:
                continue
            out = {
                "run": Path(row["run_dir"]).relative_to(sweep_dir.resolve()).as_posix(),
                "stage": stage,
                "arm": arms.get(row["run_dir"]),
                "seed": row.get("seed"),
                "status": row.get("status"),
                **{k: _scalar(row.get(k)) for k in keys},
            }
            for column, claim in measures:
                if claim is None:
                    out[column] = _scalar(row.get(column))
                    continue
                v = claim_metrics.metric(row, claim, curves)
                out[column] = None if v is None else v.x
                if claim.metric == "time_to_target":
                    out[column + CENSORED] = None if v is None else v.censored
            out["overrides"] = _overrides(Path(row["run_dir"]))
            out["diverged_why"] = row.get("diverged_why")
            table.append(out)
        frame = pd.DataFrame(table)
        if frame["diverged_why"].isna().all():
            frame = frame.drop(columns="diverged_why")
        config = claim_selection.load_config(next(r["run_dir"] for r, _ in staged
                                             if r["sweep"] == name))  # fmt: skip
        tables[name] = (frame, config["sweep"])
    return tables


def write_runs(path: Path, table: pd.DataFrame) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(path, index=False, lineterminator="\n")


def read_runs(path: Path) -> pd.DataFrame:
    """A runs.csv as written: numbers read back to the doubles written (pandas' parser
    round-trips repr), empty as missing."""
    return pd.read_csv(path, keep_default_na=False, na_values=[""])


def load(root: Path) -> list[dict[str, Any]]:
    """Every committed results/<sweep>/claims.json, in the order of the sweeps' names;
    raises ClaimsFileError naming every problem of every file before any is rendered."""
    results, problems = [], []
    for path in sorted((Path(root) / RESULTS).glob("*/claims.json")):
        name = path.parent.name
        try:
            data = read_claims(path, path.relative_to(root), sweep=name)
        except ClaimsFileError as err:
            problems.append(str(err))
            continue
        results.append({"name": name, **data})
    if problems:
        raise ClaimsFileError("\n".join(problems))
    return results
