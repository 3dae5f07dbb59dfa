"""Which W&B mode a run logs in, and what the user is told about it.

`logger.wandb_mode=auto` (the default) takes `WANDB_MODE` from the environment (W&B's own
variable; its aliases `dryrun` and `run` too), else offline; a mode set in the config wins
over `WANDB_MODE`, and says so in one line. Online, the W&B host is checked once per sweep
(a TCP connection, `CHECK_TIMEOUT_S`): when it cannot be reached, or when a run's online
start fails (no API key, say), the run logs offline instead, with one line, and the rest of
the sweep logs offline without trying again (the outcome is kept in the sweep directory).
An offline run's files are uploaded later with `wandb sync`; the command is printed once,
at the end of the run or of the sweep (`sync_line`).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

MODES = ("auto", "offline", "online", "disabled")  # what logger.wandb_mode may be
ALIASES = {"dryrun": "offline", "run": "online"}  # W&B's older names for its modes
DEFAULT_HOST = "https://api.wandb.ai"
CHECK_TIMEOUT_S = 3.0
CHECK_FILE = ".wandb_online.json"  # in a sweep directory: the sweep's one online check


def resolve(configured: str, env: Mapping[str, str] = os.environ) -> tuple[str, str | None]:
    """(the mode to use, a line to tell the user or None) for `logger.wandb_mode`."""
    given = env.get("WANDB_MODE", "")
    from_env = ALIASES.get(given, given)
    if configured == "auto":
        if from_env in MODES[1:]:
            return from_env, None
        if given:
            return "offline", f"WANDB_MODE={given} is not a W&B mode; W&B logs offline"
        return "offline", None
    if given and from_env != configured:
        return configured, (
            f"W&B logs {configured} (logger.wandb_mode={configured}), not as "
            f"WANDB_MODE={given} says"
        )
    return configured, None


def host(env: Mapping[str, str] = os.environ) -> str:
    return env.get("WANDB_BASE_URL") or DEFAULT_HOST


def unreachable(url: str, timeout_s: float = CHECK_TIMEOUT_S) -> str | None:
    """Why a TCP connection to `url`'s host cannot be opened within `timeout_s`, or None."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname or "", port), timeout=timeout_s).close()
    except OSError as exc:
        return f"{parts.hostname}:{port} cannot be reached ({exc.strerror or exc})"
    return None


def online(mode: str, sweep_dir: Path | None) -> tuple[str, str | None, bool]:
    """(the mode a run logs in, why online is off or None, whether this run found that out
    first): `mode` as `resolve` gave it, offline instead of online when the sweep's check
    (`online_check`) or an earlier start failed."""
    if mode != "online":
        return mode, None, False
    why, mine = online_check(sweep_dir)
    return ("offline" if why else "online"), why, mine


def online_check(sweep_dir: Path | None) -> tuple[str | None, bool]:
    """(why online logging is off for this run, or None; whether this run is the one that
    found out). In a sweep the first run checks and the others read its outcome."""
    kept = sweep_dir / CHECK_FILE if sweep_dir is not None else None
    if kept is not None:
        try:
            return json.loads(kept.read_text())["off"], False
        except (OSError, ValueError, KeyError):
            pass
    why = unreachable(host())
    if kept is not None:
        record_online(sweep_dir, why)
    return why, True


def record_online(sweep_dir: Path | None, why: str | None) -> None:
    """Keep the sweep's outcome (a later failed start overwrites a good check)."""
    if sweep_dir is None:
        return
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / CHECK_FILE).write_text(json.dumps({"off": why}))
    except OSError:
        pass


def offline_runs(root: Path) -> list[Path]:
    """The offline W&B runs written under `root` (a run or a sweep directory)."""
    return sorted(p for p in Path(root).glob("**/wandb/offline-run-*") if p.is_dir())


def sync_line(root: Path) -> str | None:
    """The line that tells where the offline runs under `root` are and how to upload them."""
    root = Path(root).resolve()  # a command that works from any folder
    runs = offline_runs(root)
    if not runs:
        return None
    if len(runs) == 1:
        return f"W&B: an offline run in {runs[0]}; upload it with: wandb sync {runs[0]}"
    patterns = sorted(  # a run's folders below root as `*`: one shell pattern per depth
        {"/".join(["*"] * (len(p.relative_to(root).parts) - 2) + ["wandb", "offline-run-*"])
         for p in runs}
    )  # fmt: skip
    where = " ".join(f"{root}/{pattern}" for pattern in patterns)
    return f"W&B: {len(runs)} offline runs under {root}; upload them with: wandb sync {where}"
