"""A test-only algorithm, registered the way an out-of-tree plugin registers: the
conformance suite must pick it up without a test being written for it."""

from __future__ import annotations

import dataclasses

from stalebench.algorithms import BARRIERS, Barrier, BarrierConfig


@dataclasses.dataclass
class MeanLeadConfig(BarrierConfig):
    lead: float = 1.5  # how many steps a worker may run ahead of the mean clock


@BARRIERS.register("test_mean_lead", MeanLeadConfig)
class MeanLead(Barrier):
    """Start step c only while c − mean_j clock_j ≤ lead."""

    def admit(self, worker, clocks, slowest):
        return clocks[worker] - sum(clocks) / len(clocks) <= self.cfg.lead
