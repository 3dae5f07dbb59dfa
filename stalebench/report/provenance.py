"""Where a sweep's verdicts came from, as results/<sweep>/claims.json records it: the git
commit of the code the runs recorded, the command that ran the sweep (its machine paths made
portable), the machine and the environment the runs recorded in summary.json (written there
by stalebench.job's `environment`), the wall time and the runs by status. Reads files only."""

from __future__ import annotations

import collections
import datetime as dt
import json
import os
import platform
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from stalebench.environment import package_version
from stalebench.git import git_state
from stalebench.report.collect import find_run_dirs
from stalebench.tuning import STAGE_DIR as TUNE_DIR  # <sweep_dir>/tune/: its runs

_LOOK = re.compile(r"^look[0-9]+$")  # the second stage's directories (the sweeper's)


def code_git(summaries: list[dict[str, Any]], root: Path) -> dict[str, Any]:
    """The code that produced the runs: the commit every run's summary records (`host.git`,
    `of: runs`), or, for runs older than that record, the saving checkout's (`of: save`);
    `saved_from` is the saving checkout's commit either way. Runs of several commits: no
    single commit, `commits` lists them."""
    saved = git_state(root)
    states = [(s.get("host") or {}).get("git") for s in summaries]
    if not states or not all(isinstance(g, dict) and g.get("commit") for g in states):
        return {**saved, "of": "save", "saved_from": saved["commit"]}
    commits = sorted({g["commit"] for g in states})
    paths = sorted({p for g in states for p in g.get("dirty_paths") or []})
    return {
        "commit": commits[0] if len(commits) == 1 else None,
        **({"commits": commits} if len(commits) > 1 else {}),
        "dirty": any(g.get("dirty") for g in states),
        "dirty_paths": paths[:50],
        "of": "runs",
        "saved_from": saved["commit"],
    }


def _yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None


# Hydra overrides of a command that say where it wrote or which mode (-m) it ran in, not
# how: kept out of the recorded command (a path on the machine that ran it)
WHERE = ("hydra.mode=", "hydra.sweep.dir=", "hydra.sweep.subdir=", "hydra.run.dir=")


def _task_overrides(hydra_yaml: Any) -> list[str] | None:
    """hydra.overrides.task of a saved Hydra config (multirun.yaml, .hydra/hydra.yaml),
    after the command's own Hydra overrides that say how it ran (a launcher and its jobs)."""
    try:
        overrides = hydra_yaml["hydra"]["overrides"]
        task = overrides["task"]
    except (TypeError, KeyError):
        return None
    if not isinstance(task, list):
        return None
    how = overrides.get("hydra") if isinstance(overrides, dict) else None
    how = [str(o) for o in how or [] if not str(o).startswith(WHERE)]
    return [*how, *(str(o) for o in task)]


def sweep_command(sweep_dir: Path, run_dirs: list[Path]) -> str | None:
    """The command line that ran the sweep: Hydra's multirun.yaml in the sweep directory
    keeps the command's overrides; without it, each run's own overrides
    (.hydra/overrides.yaml, else .hydra/hydra.yaml), merged key by key into `key=a,b`."""
    task = _task_overrides(_yaml(sweep_dir / "multirun.yaml"))
    if task is not None:
        return " ".join(["stalebench", "-m", *(shlex.quote(portable(o)) for o in task)])
    values: dict[str, list[str]] = {}
    for run in run_dirs:
        job = _yaml(run / ".hydra" / "overrides.yaml")
        job = job if isinstance(job, list) else _task_overrides(_yaml(run / ".hydra/hydra.yaml"))
        for override in job or []:
            key, _, value = portable(str(override)).partition("=")
            if value not in values.setdefault(key, []):
                values[key].append(value)
    if not values:
        return None
    merged = [f"{k}={','.join(v)}" if any(v) else k for k, v in values.items()]
    return " ".join(["stalebench", "-m", *map(shlex.quote, merged)])


def _mtime(*paths: Path) -> float | None:
    for path in paths:
        try:
            return path.stat().st_mtime
        except OSError:
            continue
    return None


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def wall_time(run_dirs: list[Path]) -> dict[str, Any]:
    """When the sweep ran: its first run's start, its last run's end, and `seconds`, the
    time at least one of its runs was running (the union of the runs' intervals: a sweep
    resumed later, its earlier runs reused, does not count the time in between; `span`
    does). A run starts when Hydra writes its .hydra/config.yaml (before the job runs) and
    ends when it writes summary.json (else its last event). File times survive `cp -p`,
    `rsync -t` and tar, not a plain copy."""
    spans = []
    for r in run_dirs:
        start = _mtime(r / ".hydra" / "config.yaml", r)
        end = _mtime(r / "summary.json", r / "events.jsonl")
        if start is not None and end is not None:
            spans.append((min(start, end), end))
    if not spans:
        return {"start": None, "end": None, "seconds": None, "span": None}
    spans.sort()
    busy, (lo, hi) = 0.0, spans[0]
    for a, b in spans[1:]:
        if a > hi:
            busy, lo = busy + hi - lo, a
        hi = max(hi, b)
    busy += hi - lo
    start, end = spans[0][0], max(b for _, b in spans)
    return {"start": _iso(start), "end": _iso(end), "seconds": round(busy, 1),
            "span": round(end - start, 1)}  # fmt: skip


def _summary(run: Path) -> dict[str, Any]:
    try:
        out = json.loads((run / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return out if isinstance(out, dict) else {}


def machine(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """What ran the sweep: the runs' own `host` (architecture, CPU count, load average at
    their start) and this machine's platform and package versions (save runs where the
    sweep ran)."""
    hosts = [s.get("host") or {} for s in summaries]
    loads = [h["load_avg"][0] for h in hosts if isinstance(h.get("load_avg"), list)]
    return {
        "arch": sorted({str(h["machine"]) for h in hosts if h.get("machine")})
        or [platform.machine()],
        "cpus": sorted({int(h["cpus"]) for h in hosts if h.get("cpus")}) or [os.cpu_count()],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "stalebench": package_version("stalebench"),
        "torch": package_version("torch"),
        "load_avg_1min": {
            "mean": round(sum(loads) / len(loads), 2) if loads else None,
            "max": round(max(loads), 2) if loads else None,
        },
    }


# summary.json's `host` beside the environment: where and under what load a run ran
_HOST = ("machine", "cpus", "load_avg")
# The environment's fields `check` does not compare with this machine: the OS build
# (platform: a kernel update changes it, no float result) and torch's threads (the run's
# config sets them, `num_threads`, not the machine).
NOT_COMPARED = ("platform", "torch.threads")


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"torch": {"blas": "mkl"}} → {"torch.blas": "mkl"}."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def environment(summaries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The environment the runs recorded in summary.json's `host` (stalebench.job's
    `environment`, written by the runs, which import torch; a report does not): the first
    run's, with `varies` naming every field on which runs disagree and all their values,
    and `unrecorded_runs` counting runs without one. None when no run recorded it."""
    hosts = [s.get("host") if isinstance(s.get("host"), dict) else {} for s in summaries]
    envs = [{k: v for k, v in h.items() if k not in _HOST} for h in hosts]
    recorded = [e for e in envs if e]
    if not recorded:
        return None
    values: dict[str, dict[str, Any]] = {}  # field → its distinct values, by their JSON
    for env in recorded:
        for field, value in _flat(env).items():
            values.setdefault(field, {})[json.dumps(value, sort_keys=True)] = value
    out = dict(recorded[0])
    varies = {f: [v[k] for k in sorted(v)] for f, v in values.items() if len(v) > 1}
    if varies:
        out["varies"] = varies
    if len(recorded) < len(envs):
        out["unrecorded_runs"] = len(envs) - len(recorded)
    return out


def _count(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    statuses = collections.Counter(s.get("status") or "no summary" for s in summaries)
    return {"total": len(summaries), "by_status": dict(sorted(statuses.items()))}


def provenance(sweep_dir: Path, root: Path, command: str | None = None) -> dict[str, Any]:
    """Where a sweep's verdicts came from (see the module's docstring). `runs` counts the
    final runs at the sweep's own seeds, `look_runs` the second stage's (under
    <sweep_dir>/look<k>/), `tuning_runs` the tuning stage's (under <sweep_dir>/tune/); the
    wall time spans them all."""
    stage = Path(sweep_dir) / TUNE_DIR
    tuning_runs = find_run_dirs([stage]) if stage.is_dir() else []
    staged = set(tuning_runs)  # left out of the sweep's own runs (also without tuning.json)
    found = [r for r in find_run_dirs([sweep_dir]) if r not in staged]
    later = {r for r in found if _LOOK.match(r.relative_to(sweep_dir).parts[0])}
    runs = [r for r in found if r not in later]
    summaries = {r: _summary(r) for r in [*found, *tuning_runs]}
    return {
        "git": code_git(list(summaries.values()), root),
        "command": portable_command(command) if command else sweep_command(sweep_dir, runs),
        "machine": machine(list(summaries.values())),
        "environment": environment(list(summaries.values())),
        "wall_time": wall_time([*found, *tuning_runs]),
        "runs": _count([summaries[r] for r in runs]),
        "look_runs": _count([summaries[r] for r in found if r in later]),
        "tuning_runs": _count([summaries[r] for r in tuning_runs]),
        "sweep_dir": Path(sweep_dir).resolve().name,  # its name: where it lay is the machine's
        "saved_at": _iso(dt.datetime.now(dt.timezone.utc).timestamp()),
    }


# An override whose value is a path on the machine that ran it (dataset.root=/home/x/mnist):
# recorded as `key=<local>`, the part a reader sets to their own copy
LOCAL = "<local>"
_MACHINE_PATH = re.compile(r"""^['"]?(/|~|[A-Za-z]:[\\/])""")


def portable(override: str) -> str:
    """A Hydra override without a machine's path in it: `dataset.root=/root/data/mnist` →
    `dataset.root=<local>`."""
    key, sep, value = override.partition("=")
    return f"{key}={LOCAL}" if sep and _MACHINE_PATH.match(value) else override


def portable_command(command: str) -> str:
    """A command line whose path-valued overrides are `<local>` (portable)."""
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: left as given
        return command
    return " ".join(shlex.quote(portable(w)) for w in words)
