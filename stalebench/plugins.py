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
        module = ep.load()
        conf = Path(getattr(module, "__file__", None) or ".").parent / "conf"
        if getattr(module, "__file__", None) and conf.is_dir() and conf not in _conf_dirs:
            _conf_dirs.append(conf)


def conf_dirs() -> list[Path]:
    """The loaded plugins' `conf/` folders, in entry-point order."""
    load()
    return list(_conf_dirs)
