"""Barriers and update rules; importing this package registers the built-ins."""

from stalebench.algorithms import barriers, dssp, psp, updates  # noqa: F401
from stalebench.algorithms.base import (  # noqa: F401
    BARRIERS,
    UPDATES,
    Barrier,
    BarrierConfig,
    UpdateConfig,
    UpdateRule,
)
