"""Which runs a report pools, and what each pool is called.

Runs are pooled (mean ± std over seeds) only when every value of their resolved config
(`.hydra/config.yaml`) is the same, except the seed and the bookkeeping keys in
`BOOKKEEPING`. A run without a config is known by its summary's labels only (algorithm,
cluster, workers, engine, runtime, model, dataset).

Each group is labelled `algorithm / profile / N workers / key=value ...`:

- the **profile** is the cluster preset's name, followed by the `cluster.*` values that differ
  between runs of that preset, e.g. `heterogeneous[slowdown=1,1,3,3]`;
- the **settings** are the other keys whose values differ between groups of the same
  algorithm, profile and workers (`lr=0.1`, `engine=allreduce`, `runtime=sim`), by the
  shortest dotted suffix that is unambiguous. A key that only some of those groups have
  (an engine's own option) is named only where the others do not already tell the groups
  apart. What differs between two algorithms' presets is the algorithm's, not a setting.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Iterable
from typing import Any

import pandas as pd

from stalebench.report.claim_selection import dotted, load_config

# Keys that never split a group: the seed (pooled), where and how a run was written and
# supervised, its logger, and the sweep block (its name, claims and tuning; what a sweep
# sets is in the other keys). A key is excluded with everything under it.
BOOKKEEPING = (
    "seed",
    "run_dir",
    "resume",
    "overwrite",
    "checkpoint_every_s",
    "timeout_s",
    "grace_s",
    "listen_host",
    "logger",
    "sweep",
    "hydra",
    "dataset.root",
)
# What a run without a config is known by: summary.json's labels, as config keys.
SUMMARY_KEYS = {
    "engine": "engine.name",
    "runtime": "runtime",
    "model": "model.name",
    "dataset": "dataset.name",
}
# Columns of the runs and summary tables a setting's short name must not take.
RESERVED = {
    "algorithm", "cluster", "num_workers", "workers", "seed", "run_dir", "status", "error",
    "runs", "completed", "group", "arm", "profile", "clock", "target_split", "target_accuracy",
}  # fmt: skip
MISSING = "—"


def excluded(key: str) -> bool:
    return any(key == b or key.startswith(b + ".") for b in BOOKKEEPING)


def text(value: Any) -> str:
    """A config value as a label shows it: 0.1, 1e-05, true, null, 1,1,3,3, [] (empty)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return MISSING
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    if isinstance(value, list | tuple):
        return ",".join(text(v) for v in value) if value else "[]"
    if isinstance(value, dict):
        return "{" + " ".join(f"{k}:{text(v)}" for k, v in value.items()) + "}"
    return str(value)


def display(value: Any) -> str:
    """A table cell's value: its text, or "—" when the run has none."""
    return MISSING if _missing(value) else text(value)


def _comparable(value: Any) -> Any:
    """Scalars as they are (1 == 1.0), containers by their text."""
    return text(value) if isinstance(value, list | tuple | dict) else value


def settings(config: dict) -> dict[str, Any]:
    """A run's config as dotted keys → comparable values, bookkeeping left out."""
    return {k: _comparable(v) for k, v in dotted(config).items() if not excluded(k)}


def _missing(x: Any) -> bool:
    if x is None:
        return True
    try:
        return bool(pd.isna(x))
    except (TypeError, ValueError):
        return False


def _from_summary(run: dict) -> dict[str, Any]:
    return {key: run[col] for col, key in SUMMARY_KEYS.items() if not _missing(run.get(col))}


def load_configs(run_dirs: Iterable[str]) -> dict[str, dict]:
    """Each run directory's resolved config ({} without a readable one)."""
    configs = {}
    for run_dir in run_dirs:
        try:
            configs[run_dir] = load_config(run_dir)
        except Exception as err:  # a damaged config.yaml: the run keeps its summary labels
            warnings.warn(f"{run_dir}: unreadable .hydra/config.yaml ({err})", stacklevel=2)
            configs[run_dir] = {}
    return configs


def _varying(sigs: list[dict[str, Any]], keys: list[str]) -> list[str]:
    """Keys with at least two different values among the signatures that have them."""
    return [k for k in keys if len({s[k] for s in sigs if k in s}) > 1]


def _freeze(sig: dict[str, Any]) -> tuple:
    return tuple(sorted(sig.items(), key=lambda kv: kv[0]))


def _split(sigs: list[dict[str, Any]], shown: list[str], keys: list[str]) -> list[str]:
    """`shown`, plus those of `keys` (in order) that tell apart two signatures the shown
    keys give one label (keys that some signatures lack)."""
    shown = list(shown)
    for key in keys:
        if key in shown:
            continue
        alike: dict[tuple, dict[tuple, dict]] = {}
        for s in sigs:
            alike.setdefault(tuple(s.get(k, MISSING) for k in shown), {})[_freeze(s)] = s
        clashes = [list(same.values()) for same in alike.values() if len(same) > 1]
        if not clashes:
            break
        if any(len({s.get(key, MISSING) for s in clash}) > 1 for clash in clashes):
            shown.append(key)
    return shown


def short_names(keys: list[str]) -> dict[str, str]:
    """Dotted keys → the shortest dotted suffix unique among them (`lr`, `update.lr`); a
    component's `name` goes by its component (`engine.name` → `engine`)."""
    bases = {k: (k[: -len(".name")] if k.endswith(".name") else k).split(".") for k in keys}
    names = {}
    for key, parts in bases.items():
        for n in range(1, len(parts) + 1):
            name = ".".join(parts[-n:])
            clash = any(o != key and ".".join(p[-n:]) == name for o, p in bases.items())
            if not clash and name not in RESERVED:
                break
        else:
            name = key
        names[key] = name
    return names


def _order(value: Any) -> tuple:
    """Numbers first, by value; then text in natural order (SSP(1), SSP(3), SSP(10): the
    digits in a label compare as numbers); missing last."""
    if _missing(value):
        return (2, 0.0, ())
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, float(value), ())
    chunks = re.findall(r"\d+|\D+", str(value))
    return (1, 0.0, tuple((0, int(c), "") if c.isdigit() else (1, 0, c) for c in chunks))


def _profiles(
    records: list[dict], sigs: list[dict[str, Any]], keys: list[str]
) -> tuple[list[Any], list[str]]:
    """Each run's cluster label: its preset's name and the `cluster.*` keys (of `keys`) that
    differ between the runs of that preset, e.g. `heterogeneous[slowdown=1,1,3,3]`; and
    those keys, of every preset."""
    by_preset: dict[str, list[dict[str, Any]]] = {}
    for run, sig in zip(records, sigs, strict=True):
        by_preset.setdefault(_label(run.get("cluster")), []).append(sig)
    shown = {preset: _varying(group, keys) for preset, group in by_preset.items()}
    labels = []
    for run, sig in zip(records, sigs, strict=True):
        name = _label(run.get("cluster"))
        changed = [f"{k.split('.', 1)[1]}={text(sig[k])}" for k in shown[name] if k in sig]
        label = name + (f"[{'; '.join(changed)}]" if changed else "")
        labels.append(label or None)
    return labels, [k for k in keys if any(k in v for v in shown.values())]


def _label(x: Any) -> str:
    return "" if _missing(x) else text(x)


def assign(
    runs: pd.DataFrame, configs: dict[str, dict] | None = None
) -> tuple[pd.DataFrame, dict[str, str]]:
    """`runs` with the columns `profile` (the cluster's label), `arm` (the algorithm and its
    settings), `group` (the full label; one per group) and `group_index` (the groups in
    sorted order), plus a column per differing key (dotted) it lacks; and the settings
    shown, dotted key → short name, in config order. `configs`: run_dir → config (default:
    read from each run_dir)."""
    records = runs.to_dict("records")
    if configs is None:
        configs = load_configs([str(r.get("run_dir")) for r in records])
    sigs, has_config = [], []
    for run in records:
        config = configs.get(str(run.get("run_dir"))) or {}
        has_config.append(bool(config))
        sigs.append(settings(config) if config else _from_summary(run))
    keys = [k for k in dict.fromkeys(k for s in sigs for k in s) if k != "cluster.num_workers"]
    cluster_keys = [k for k in keys if k.startswith("cluster.")]
    other_keys = [k for k in keys if not k.startswith("cluster.")]
    profiles, shown_cluster = _profiles(records, sigs, cluster_keys)

    # per (algorithm, profile, workers), the keys that tell its groups apart; runs without
    # a config are compared among themselves (their summary's labels)
    def cell(i: int) -> tuple:
        run = records[i]
        return _label(run.get("algorithm")), profiles[i], _label(run.get("num_workers"))

    cohorts: dict[tuple, list[int]] = {}
    for i in range(len(records)):
        cohorts.setdefault((*cell(i), has_config[i]), []).append(i)
    shown_in = {}
    for cohort, members in cohorts.items():
        members_sigs = [sigs[i] for i in members]
        shown_in[cohort] = _split(members_sigs, _varying(members_sigs, other_keys), other_keys)
    shown_all = [k for k in other_keys if any(k in shown for shown in shown_in.values())]
    names = short_names(shown_all)

    arms, groups, frozen = [], [], []
    for i in range(len(records)):
        shown = shown_in[(*cell(i), has_config[i])]
        parts = [f"{names[k]}={text(sigs[i].get(k, MISSING))}" for k in shown]
        if not has_config[i] and (*cell(i), True) in cohorts:
            parts.append("(no config)")
        algorithm, workers = cell(i)[0], cell(i)[2]
        arms.append(" ".join([algorithm, *parts]).strip())
        head = [algorithm, profiles[i] or MISSING, f"{workers or MISSING} workers"]
        groups.append(" / ".join(head + ([" ".join(parts)] if parts else [])))
        frozen.append((_freeze(sigs[i]), has_config[i], cell(i)))
    # groups whose labels come out alike (values that print the same): numbered
    seen: dict[str, list] = {}
    for label, f in zip(groups, frozen, strict=True):
        if f not in seen.setdefault(label, []):
            seen[label].append(f)
    number = [
        "" if len(seen[g]) == 1 else f" #{seen[g].index(f) + 1}"
        for g, f in zip(groups, frozen, strict=True)
    ]
    groups = [g + n for g, n in zip(groups, number, strict=True)]
    arms = [a + n for a, n in zip(arms, number, strict=True)]

    out = runs.copy()
    for key in [*shown_all, *shown_cluster]:
        if key not in out:
            out[key] = [s.get(key) for s in sigs]
    out["profile"], out["arm"], out["group"] = profiles, arms, groups
    order = {
        g: (
            _order(run.get("algorithm")), _order(profile), _order(run.get("num_workers")),
            *(_order(sig.get(k)) for k in shown_all), g,
        )
        for g, run, profile, sig in zip(groups, records, profiles, sigs, strict=True)
    }  # fmt: skip
    rank = {g: n for n, g in enumerate(sorted(order, key=order.get))}
    out["group_index"] = [rank[g] for g in groups]
    return out, {k: names[k] for k in shown_all}
