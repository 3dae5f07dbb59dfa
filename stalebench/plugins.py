"""Loading every component: the built-ins (importing a package registers them) and the
modules of the `stalebench.plugins` entry points. It sits above every registry, so no
registry imports what it registers; the CLI, `experiment` and each spawned process call
`load` before they look anything up.

A plugin may bring YAML configs too: a `conf/` folder beside its entry point's module (in
its package, for a package) is searched after stalebench's own, for presets
(`conf/algorithm/<name>.yaml`), cluster profiles and sweeps (`hydra_plugins/
stalebench_conf` adds it to Hydra's search path; `stalebench list` and the CLI's checks
read it too)."""

from __future__ import annotations

import os
from importlib.metadata import entry_points
from pathlib import Path

GROUP = "stalebench.plugins"

_loaded = False
_conf_dirs: list[Path] = []


def load() -> None:
    """Import the built-in components and every `stalebench.plugins` entry point, once."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    import stalebench.algorithms  # noqa: F401  (registers built-ins)
    import stalebench.cluster  # noqa: F401
    import stalebench.data  # noqa: F401
    import stalebench.engines  # noqa: F401
    import stalebench.models  # noqa: F401

    for ep in entry_points(group=GROUP):
        where = getattr(ep.load(), "__file__", None)  # a namespace package has none
        conf = Path(where).parent / "conf" if where else None
        if conf is not None and conf.is_dir() and conf not in _conf_dirs:
            _conf_dirs.append(conf)


def rank_imports(cfg, engine) -> list[str]:
    """What a real run's ranks import beyond the runtime's own, for its fork server to
    import once (runtime/forkserver.py): the engine's module and its role programs', and what
    the algorithm's parts import when first used (a registered part's `imports`); a part
    named by no registry is refused here, by name."""
    from stalebench.registry import PARTS, REGISTRIES

    imports = [type(engine).__module__, *engine.program_modules]
    for slot in PARTS:
        part, registry = getattr(cfg.algorithm, slot), REGISTRIES.get(f"algorithm/{slot}")
        if part is not None and registry is not None:
            imports += getattr(registry.get(part.name)[0], "imports", ())
    return imports


def user_conf() -> Path:
    """The user's config folder (`$STALEBENCH_CONF`, or ~/.config/stalebench): profiles
    written there (`stalebench calibrate`) compose like the built-in ones."""
    return Path(os.environ.get("STALEBENCH_CONF") or Path.home() / ".config" / "stalebench")


def conf_dirs() -> list[Path]:
    """The loaded plugins' `conf/` folders, in entry-point order, then the user's own
    (`user_conf`), if it exists."""
    load()
    user = user_conf()
    return [*_conf_dirs, *([user] if user.is_dir() else [])]


def yaml_files(group: str) -> list:
    """The YAML configs of a config group (`algorithm`, `cluster`, `sweep`, ...):
    stalebench's own, then the plugins'."""
    from importlib.resources import files

    found = []
    for conf in [files("stalebench.conf"), *conf_dirs()]:
        folder = conf.joinpath(group)
        if folder.is_dir():
            found += [f for f in folder.iterdir() if f.name.endswith(".yaml")]
    return found
