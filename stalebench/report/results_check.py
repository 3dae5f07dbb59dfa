"""`stalebench-results --check`: every verdict recomputed from its results/<sweep>/runs.csv
and compared with the committed one, the committed pages compared with what the results
render to, and warnings where a result's recorded environment differs from this machine's
(probed with stalebench.job's `environment` in a subprocess: a report imports no torch)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from stalebench.report import claim_metrics, claim_selection, claim_stats, claim_verdicts
from stalebench.report.collect import CURVE_COLUMNS
from stalebench.report.provenance import NOT_COMPARED, _flat
from stalebench.report.results_files import CENSORED, RESULTS, RUNS, TUNING_STAGE, load, read_runs
from stalebench.report.results_page import PAGE, README, rendered
from stalebench.report.tuning_summary import _cell
from stalebench.sweep import claim_from_dict


def _evaluator_inputs(
    table: pd.DataFrame, sweep: dict[str, Any], where: Path
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, dict[str, Any]]]:
    """The runs, curves and configs from which claims.evaluate computes, for each run of the
    table but the tuning stage's, the numbers the table holds: each run named as a directory
    under `where`, its config the sweep's block (the claims), written once to `where`'s
    .hydra/config.yaml and read back as a run's is (claims.load_config), one for all; a
    final accuracy, loss or perplexity as summary.json's final_tail; a time to target as a
    curve that reaches the target at that time (one evaluation at the target's value), or,
    censored, ends there without reaching it (`metric` censors at a run's end, its last
    evaluation here)."""
    columns = list(table.columns)
    targets = {
        claim_metrics.target_label(c.target): c.target
        for c in (claim_from_dict(raw) for raw in sweep.get("claims") or [])
        if c.target is not None
    }
    runs, points, configs = [], [], {}
    config = None  # every run's: the same file, written and read once (with the first run)
    for rec in table.to_dict("records"):
        if rec.get("stage") == TUNING_STAGE:
            continue
        if config is None:
            (where / ".hydra").mkdir(parents=True, exist_ok=True)
            (where / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"sweep": sweep}))
            config = claim_selection.load_config(where)
        run_dir = where / str(rec["run"])
        configs[str(run_dir)] = config
        stage = str(rec.get("stage") or "final")
        look = 1 if stage == "final" else int(stage.removeprefix("look"))
        row = {"run_dir": str(run_dir), "final_tail_evals": 1, "sweep.look": look}
        for key in columns:
            x = rec[key]
            x = None if isinstance(x, float) and math.isnan(x) else x
            if key in targets:
                if x is None:
                    continue
                t = targets[key]
                if rec.get(key + CENSORED) in (True, "True", 1):
                    points.append({"run_dir": str(run_dir), "t": float(x), "split": "end"})
                else:
                    points.append({"run_dir": str(run_dir), "t": float(x), "split": t.split,
                                   t.key: t.value})  # fmt: skip
            elif not key.endswith(CENSORED) and key not in ("run", "stage", "overrides"):
                row[key] = x
                if key in claim_metrics.TAIL_METRICS:
                    row[f"final_tail_{claim_metrics.TAIL_METRICS[key]}"] = x
        runs.append(row)
    curves = pd.DataFrame(points, columns=CURVE_COLUMNS)
    return pd.DataFrame(runs), curves, configs


def recompute(table: pd.DataFrame, sweep: dict[str, Any]) -> list[dict[str, Any]]:
    """Every claim's verdict record as claims.evaluate makes it from the table's runs alone
    (the runs of looks 1.., not the tuning stage's), judged by the claims of `sweep`."""
    with tempfile.TemporaryDirectory() as tmp:
        runs, curves, configs = _evaluator_inputs(table, sweep, Path(tmp))
        return claim_verdicts.evaluate(runs, curves, configs)


# what `--check` compares between a committed verdict and the one recomputed from runs.csv
# (numbers equal to RESOLUTION, relative: the same sums in the same order agree exactly)
COMPARED = ("verdict", "n", "estimate", "p", "p_holm")


def _effects(v: dict[str, Any]) -> dict[str, Any]:
    """A verdict's numbers: COMPARED, ours of a reproduced number, each step's estimate."""
    out = {k: v.get(k) for k in COMPARED}
    out["ours"] = (v.get("reproduced") or {}).get("ours")
    for step in v.get("steps") or []:
        out[f"step {step.get('label')} estimate"] = step.get("estimate")
    return out


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=claim_stats.RESOLUTION, abs_tol=1e-300)
    return a == b


def differences(committed: list[dict], recomputed: list[dict], where: str) -> list[str]:
    """One line per committed claim whose verdict, n, effect or p differ from the recomputed
    one's (or that is not recomputed), naming the claim and each value both ways."""
    mine = {v["id"]: v for v in recomputed}
    lines = []
    for v in committed:
        got = mine.get(v["id"])
        if got is None:
            lines.append(f"{where}: claim {v['id']}: not among the claims of its sweep_config")
            continue
        theirs, ours = _effects(v), _effects(got)
        diff = [f"{k} {_cell(theirs.get(k))} in claims.json, {_cell(ours.get(k))} from "
                f"{RUNS}" for k in dict.fromkeys([*theirs, *ours])
                if not _equal(theirs.get(k), ours.get(k))]  # fmt: skip
        if diff:
            lines.append(f"{where}: claim {v['id']}: {'; '.join(diff)}")
    return lines


def check_runs(root: Path) -> tuple[list[str], list[str]]:
    """Every committed result with a runs.csv recomputed from it: (one line per claim that
    differs, or per table that cannot be read; the sweeps without a per-run table)."""
    problems, untabled = [], []
    for result in load(root):
        name = result["name"]
        path = Path(root) / RESULTS / name / RUNS
        where = f"{RESULTS}/{name}/{RUNS}"
        if not path.is_file():
            untabled.append(name)
            continue
        sweep = result.get("sweep_config")
        if not sweep:
            problems.append(f'{where}: claims.json has no "sweep_config" (the claims to judge)')
            continue
        try:
            verdicts = recompute(read_runs(path), sweep)
        except (ValueError, KeyError, TypeError, pd.errors.ParserError) as err:
            problems.append(f"{where}: cannot be judged: {err}")
            continue
        problems += differences(result["claims"], verdicts, where)
    return problems, untabled


def _first_difference(rel: str, have: str, want: str) -> str | None:
    if have == want:
        return None
    a, b = have.splitlines(), want.splitlines()
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    got = a[n] if n < len(a) else "(end of file)"
    expected = b[n] if n < len(b) else "(end of file)"
    return (
        f"{rel}, line {n + 1}, differs from what results/*/claims.json render to:\n"
        f"  committed: {got}\n  rendered:  {expected}"
    )


def check(root: Path) -> str | None:
    """None when docs/results.md and README.md's block are what the committed results
    render to; else the first difference."""
    try:
        page, readme = rendered(root)
    except LookupError as err:
        return str(err)
    path = Path(root) / PAGE
    have = path.read_text() if path.is_file() else ""
    return _first_difference(PAGE, have, page) or _first_difference(
        README, (Path(root) / README).read_text(), readme
    )


# The probe `check` runs for this machine's environment: the runs' own function, in a
# subprocess because it imports torch (a report does not, the import-linter contract "reports
# read files only"), so a saved environment and this machine's have one definition.
PROBE = "import json; from stalebench.job import environment; print(json.dumps(environment()))"


def this_machine(timeout: float = 120.0) -> tuple[dict[str, Any] | None, str | None]:
    """This machine's environment as a run would record it, or None and why not. Probed
    once a process for its interpreter (an interpreter importing torch: seconds of CPU),
    the probe's answer read again on every later call; a probe that failed is not kept."""
    if sys.executable in _PROBED:
        return json.loads(_PROBED[sys.executable]), None
    try:
        out = subprocess.run(
            [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=timeout
        )
    except (OSError, subprocess.SubprocessError) as err:
        return None, str(err)
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        return None, lines[-1] if lines else f"exit {out.returncode}"
    try:
        here = json.loads(out.stdout)
    except ValueError:
        return None, f"not JSON: {out.stdout[:80]!r}"
    _PROBED[sys.executable] = out.stdout
    return here, None


_PROBED: dict[str, str] = {}  # this_machine's probe: the interpreter -> what it printed


def _differs(field: str, recorded: Any, here: Any) -> str:
    if isinstance(recorded, list) and isinstance(here, list):  # CPU flags: what changed
        lacks, adds = sorted(set(recorded) - set(here)), sorted(set(here) - set(recorded))
        parts = [
            f"lacks {' '.join(lacks)}" if lacks else "",
            f"adds {' '.join(adds)}" if adds else "",
        ]
        return f"{field}: this machine {', '.join(p for p in parts if p)}"
    return f"{field}: recorded {json.dumps(recorded)}, this machine {json.dumps(here)}"


def environment_warnings(
    results: list[dict[str, Any]], here: dict[str, Any] | None, why: str | None = None
) -> list[str]:
    """One line per field in which a committed result's environment differs from `here`
    (NOT_COMPARED left out; a field on which the sweep's runs disagreed differs when `here`
    matches none of their values), one line per result saved without an environment, and
    one line when `here` could not be read (`why`)."""
    lines = []
    if here is None and any((r.get("provenance") or {}).get("environment") for r in results):
        lines.append(f"this machine's environment could not be read ({why}): not compared")
    mine = _flat(here or {})
    for result in results:
        where = f"{RESULTS}/{result['name']}/claims.json"
        env = (result.get("provenance") or {}).get("environment")
        if not env:
            lines.append(
                f"{where}: environment unrecorded (saved before runs recorded it): whether "
                "this machine reproduces its numbers is unknown"
            )
            continue
        if here is None:
            continue
        varies = env.get("varies") if isinstance(env.get("varies"), dict) else {}
        recorded = _flat({k: v for k, v in env.items() if k not in ("varies", "unrecorded_runs")})
        for field in sorted(set(recorded) | set(mine)):
            if field in NOT_COMPARED:
                continue
            values = varies.get(field) or [recorded.get(field)]
            if mine.get(field) not in values:
                shown = values if len(values) > 1 else values[0]
                lines.append(f"{where}: {_differs(field, shown, mine.get(field))}")
    return lines


def check_environment(root: Path) -> list[str]:
    """environment_warnings for the committed results against this machine (probed only
    when a result has an environment to compare)."""
    results = load(root)
    if not any((r.get("provenance") or {}).get("environment") for r in results):
        return environment_warnings(results, None)
    return environment_warnings(results, *this_machine())
