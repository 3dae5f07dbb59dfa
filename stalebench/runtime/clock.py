"""The simulator's virtual clock: a queue of events by virtual time, ties broken by the
order they were scheduled in (so a config and a seed give one history)."""

from __future__ import annotations

import heapq
import itertools
from typing import Any


class EventQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Any]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, t: float, item: Any) -> None:
        heapq.heappush(self._heap, (t, next(self._order), item))

    def pop(self) -> tuple[float, Any]:
        """The earliest event: (virtual time, item)."""
        t, _, item = heapq.heappop(self._heap)
        return t, item

    def first(self) -> float:
        """The earliest event's time (inf when none is left)."""
        return self._heap[0][0] if self._heap else float("inf")
