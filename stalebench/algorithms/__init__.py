"""Barriers and update rules; importing this package registers the built-ins."""

from stalebench.algorithms import (  # noqa: F401
    barriers,
    dana,
    dssp,
    psp,
    staleness,
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
