"""Loading every component: the built-ins (importing a package registers them) and the
modules of the `stalebench.plugins` entry points. It sits above every registry, so no
registry imports what it registers; the CLI, `experiment` and each spawned process call
`load` before they look anything up."""

from __future__ import annotations

from importlib.metadata import entry_points

GROUP = "stalebench.plugins"

_loaded = False


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
        ep.load()
