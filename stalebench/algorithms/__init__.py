"""Barriers, update rules and pipeline stage optimizers; importing this package registers
the built-ins."""

from stalebench.algorithms import (  # noqa: F401
    barriers,
    dana,
    dssp,
    gba,
    gossip,
    local,
    pipeline,
    psp,
    staleness,
    torch_optim,
    updates,
)
from stalebench.algorithms.base import (  # noqa: F401
    BARRIERS,
    UPDATES,
    Barrier,
    BarrierConfig,
    UpdateConfig,
    UpdateRule,
)
