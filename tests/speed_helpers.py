"""Helpers that make the suite's real runs cheaper without changing what they run."""

from __future__ import annotations


def fork_server_for_every_engine() -> None:
    """Start the real runtime's fork server (`stalebench.runtime.forkserver`) with what the
    ranks of every registered engine import, and an optimizer's torch._dynamo: a module
    whose real runs go from one engine to another then forks every rank from one server,
    instead of starting a new one (torch imported again) at each change of engine."""
    from stalebench.algorithms.torch_optim import IMPORTS
    from stalebench.config import ENGINES
    from stalebench.runtime import forkserver

    modules: list[str] = []
    for name in ENGINES.names():
        engine = ENGINES.get(name)[0]
        if "real" in engine.runtimes:
            modules += [engine.__module__, *engine.program_modules]
    forkserver.start([*modules, *IMPORTS])
