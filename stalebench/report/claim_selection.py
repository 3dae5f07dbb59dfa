"""Which runs a claim compares: each run's config (.hydra/config.yaml) read as plain data
and flattened to dotted keys beside its summary.json fields, the sweeps and claims the configs
name, and the runs a claim's selector (`a`, `b`, `c`, `where`) picks.

Part of judging a sweep's claims (stalebench.report.claim_judge states the rule)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from stalebench.sweep import claim_from_dict, sequential_from


class ClaimError(ValueError):
    """A claim that cannot be judged from these runs as written (a selector that matches
    two runs of one seed)."""


def load_config(run_dir: str | Path) -> dict[str, Any]:
    """A run's config (.hydra/config.yaml) as plain data, interpolations such as
    `${sweep.params.target}` resolved; {} when absent."""
    from omegaconf import OmegaConf  # Hydra's config library; no torch, no engine code

    path = Path(run_dir) / ".hydra" / "config.yaml"
    if not path.is_file():
        return {}
    config = OmegaConf.load(path)
    try:
        return OmegaConf.to_container(config, resolve=True) or {}
    except Exception:  # an interpolation only Hydra's runtime can resolve: leave them all
        return OmegaConf.to_container(config, resolve=False) or {}


def dotted(obj: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted keys -> leaves (an empty mapping below the top is a leaf of
    its own, so that `{}` and a filled mapping differ)."""
    if not isinstance(obj, dict) or (not obj and prefix):
        return {prefix: obj}
    out: dict[str, Any] = {}
    for key, value in obj.items():
        out.update(dotted(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def claim_rows(
    runs: pd.DataFrame, configs: Mapping[str, dict[str, Any]] | None = None
) -> tuple[list[dict], dict[str, dict]]:
    """One dict per run (summary fields + dotted config keys, e.g. `algorithm.barrier.staleness`)
    and the sweeps found in the runs' configs: name -> {paper, scale, claims}. `configs`:
    each run directory's config already read (load_config's), else each is read here."""
    rows, sweeps = [], {}
    for run in runs.to_dict("records"):
        if configs is None:
            config = load_config(run["run_dir"])
        else:
            config = configs[run["run_dir"]]
        name = add_sweep(config, sweeps)
        keys = {k: v for k, v in dotted(config).items() if "." in k and k != "sweep.claims"}
        rows.append({**keys, **run, "sweep": name})
    return rows, sweeps


def add_sweep(config: dict[str, Any], sweeps: dict[str, dict]) -> str:
    """The name of the sweep a run's config belongs to ("" for none), its paper, scale,
    claims and second stage added to `sweeps` the first time it is seen."""
    sweep = config.get("sweep") or {}
    name = sweep.get("name") or ""
    if name and name not in sweeps:
        sweeps[name] = {
            "paper": sweep.get("paper", ""),
            "scale": sweep.get("scale", ""),
            "claims": [
                claim_from_dict(c, f"sweep {name}: claims[{i}]")
                for i, c in enumerate(sweep.get("claims") or [])
            ],
            "sequential": sequential_from(sweep.get("sequential")),
        }
    return name


def _same(have: Any, want: Any) -> bool:
    if isinstance(want, list | tuple):
        return any(_same(have, w) for w in want)
    try:
        return float(have) == float(want)
    except (TypeError, ValueError):
        return str(have) == str(want)


def _matcher(want: Any):
    """`have -> _same(have, want)`, with `want` looked at once rather than per row: a str
    that is no number (an algorithm's name) equals a str `have` exactly when the two are
    the same string, and a float or int one equals a float `have` exactly when their
    floats are equal, which is what _same finds for them after its float() attempts."""
    if type(want) is str:
        try:
            float(want)
        except ValueError:
            return lambda have: have == want if type(have) is str else _same(have, want)
    elif type(want) in (int, float):
        try:
            number = float(want)
        except OverflowError:  # an int past a float: _same's own path raises or compares
            return lambda have: _same(have, want)
        return lambda have: float(have) == number if type(have) is float else _same(have, want)
    return lambda have: _same(have, want)


def select(rows: list[dict], selector: dict[str, Any]) -> list[dict]:
    """The rows whose value of every key of the selector is the same as its (`_same`)."""
    picked = list(rows)
    for key, same in [(k, _matcher(v)) for k, v in selector.items()]:
        picked = [r for r in picked if same(r.get(key))]
    return picked
