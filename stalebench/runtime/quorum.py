"""The replicas of a serverless run that are still alive, and a gloo group over them.

gloo cannot shrink a process group, so when a collective fails (a peer died, or was silent
past timeout_s) the survivors make a new one, as torchft's Manager does per quorum: each
registers in the run's store under the next epoch, waits until every member of the current
group has registered or is known dead (the supervisor marks each rank that exits with an
error: `dead/<rank>`), at most timeout_s, and the first to finish waiting writes the
members it saw; every rank reads those (`compare_set`), so all agree. A rank left out (it
came after the wait: silent too long) gets a RunError. The new group meets over a prefix of
the same store.

A replica lost between two collectives (a `die` fault, a process killed while computing)
is what this handles; one killed inside an all-reduce could leave some survivors with that
round summed and others without (torchft adds a commit step for it): not handled.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from stalebench.errors import RunError

log = logging.getLogger("stalebench")


def mark_dead(store: dist.Store, rank: int) -> None:
    """The supervisor's word that `rank` exited with an error: no quorum waits for it."""
    store.set(f"dead/{rank}", "1")


class Quorum:
    def __init__(self, store: dist.Store, rank: int, size: int, timeout_s: float):
        self.store, self.rank, self.timeout_s = store, rank, timeout_s
        self.members, self.epoch = list(range(size)), 0  # epoch 0: the default group

    def check(self) -> None:
        """Raise if another rank has begun to regroup (its collective failed): this one's
        cannot complete either, but gloo would say so only after timeout_s."""
        if self.store.check([f"quorum/{self.epoch + 1}/open"]):
            raise RunError("another rank lost a peer and regroups")

    def reform(self, transport: Any, cause: Exception) -> list[int]:
        """After `cause` (a failed collective): agree with the other survivors on who is
        left, point `transport`'s collectives at a group of them; returns the members."""
        epoch, store = self.epoch + 1, self.store
        store.set(f"quorum/{epoch}/open", "1")  # the others' collectives stop waiting: `check`
        log.warning("rank %d: %s; agreeing on the ranks left (epoch %d)", self.rank, cause, epoch)
        prefix = f"quorum/{epoch}/"
        store.set(prefix + str(self.rank), "1")
        deadline = time.monotonic() + self.timeout_s
        while True:
            came = [r for r in self.members if store.check([prefix + str(r)])]
            dead = [r for r in self.members if r not in came and store.check([f"dead/{r}"])]
            if len(came) + len(dead) == len(self.members) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        seen = ",".join(map(str, came))
        members = [
            int(r) for r in store.compare_set(prefix + "members", "", seen).decode().split(",")
        ]
        if self.rank not in members:
            raise RunError(
                f"rank {self.rank} was left out of the replicas that went on (it came after "
                f"timeout_s={self.timeout_s:g}; the round failed with: {cause})"
            )
        group = dist.ProcessGroupGloo(
            dist.PrefixStore(prefix + "group", store),
            members.index(self.rank),
            len(members),
            timedelta(seconds=self.timeout_s),
        )
        transport.regroup(group)
        log.warning("rank %d: going on with ranks %s (epoch %d)", self.rank, members, epoch)
        self.members, self.epoch = members, epoch
        return members
