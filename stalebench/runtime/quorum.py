"""The replicas of a serverless run that are still alive, a gloo group over them, and the
spares that take lost replicas' places.

gloo cannot shrink a process group, so when a collective fails (a peer died, or was silent
past timeout_s) the survivors make a new one, as torchft's Manager does per quorum: each
registers in the run's store under the next epoch (which also stops the others' waits:
`check`), waits until every member of the current group has registered or is known dead
(the supervisor marks each rank that exits with an error: `dead/<rank>`), at most
timeout_s, and the first to finish waiting writes the members it saw, with the spares
standing by that are to take the lost ones' places; every rank reads that (`compare_set`),
so all agree. A rank left out (it came after the wait: silent too long) gets a RunError.
The new group meets over a prefix of the same store. The round is then summed again over
the survivors; at its end they `welcome` the spares chosen: a group over them all, and the
state the program hands over, broadcast from the lowest survivor.

A replica lost between two collectives (a `die` fault, a process killed while computing)
is what this handles; one killed inside an all-reduce could leave some survivors with that
round summed and others without (torchft adds a commit step for it): not handled.
"""

from __future__ import annotations

import io
import logging
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from stalebench.errors import RunError
from stalebench.runtime import checkpoint

log = logging.getLogger("stalebench")

POLL_S = 0.01


def mark_dead(store: dist.Store, rank: int) -> None:
    """The supervisor's word that `rank` exited with an error: no quorum waits for it."""
    store.set(f"dead/{rank}", "1")


class Quorum:
    """This rank's view: the members of the current group (ranks), its epoch, the spares
    chosen to join at the next `welcome` ((spare, lost rank) pairs)."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout_s: float, active: int):
        self.store, self.rank, self.timeout_s, self.size = store, rank, timeout_s, size
        self.members, self.epoch = list(range(active)), 0  # the ranks in rounds from the start
        self.spares = list(range(active, size))
        self.grouped = active == size  # with spares, the rounds' first group leaves them out
        self.joining: list[tuple[int, int]] = []

    def resume(self, members: list[int]) -> None:
        """A resumed run: the rounds go on over `members` (those in the checkpoint set);
        the other ranks stand by as spares."""
        self.members = list(members)
        self.spares = [r for r in range(self.size) if r not in members]
        self.grouped = not self.spares

    def _group(self, epoch: int, members: list[int]) -> Any:
        return dist.ProcessGroupGloo(
            dist.PrefixStore(f"quorum/{epoch}/group", self.store),
            members.index(self.rank),
            len(members),
            timedelta(seconds=self.timeout_s),
        )

    def start(self, transport: Any) -> None:
        """Before the first round: with spares standing by, a group of the others."""
        if not self.grouped:
            transport.regroup(self._group(0, self.members), self.members)
            self.grouped = True

    def check(self) -> None:
        """Raise if another rank has begun to regroup (its collective failed): this one's
        cannot complete either, but gloo would say so only after timeout_s."""
        if self.store.check([f"quorum/{self.epoch + 1}/open"]):
            raise RunError("another rank lost a peer and regroups")

    def reform(self, transport: Any, cause: Exception) -> list[int]:
        """After `cause` (a failed collective): agree with the other survivors on who is
        left (and which spares take the lost ones' places), point `transport`'s collectives
        at a group of the survivors; returns them."""
        epoch, store = self.epoch + 1, self.store
        log.warning("rank %d: %s; agreeing on the ranks left (epoch %d)", self.rank, cause, epoch)
        prefix = f"quorum/{epoch}/"
        store.set(prefix + "open", "1")
        store.set(prefix + str(self.rank), "1")
        deadline = time.monotonic() + self.timeout_s
        while True:
            came = [r for r in self.members if store.check([prefix + str(r)])]
            dead = [r for r in self.members if r not in came and store.check([f"dead/{r}"])]
            if len(came) + len(dead) == len(self.members) or time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        lost = [r for r in self.members if r not in came]
        ready = [s for s in self.spares if store.check([f"spare/{s}/ready"])]
        seen = (
            ",".join(map(str, came))
            + "|"
            + ",".join(f"{s}:{r}" for s, r in zip(ready, lost, strict=False))
        )
        agreed = store.compare_set(prefix + "members", "", seen).decode()
        left, chosen = agreed.split("|")
        members = [int(r) for r in left.split(",")]
        if self.rank not in members:
            raise RunError(
                f"rank {self.rank} was left out of the replicas that went on (it came after "
                f"timeout_s={self.timeout_s:g}; the round failed with: {cause})"
            )
        self.joining = [tuple(map(int, p.split(":"))) for p in chosen.split(",") if p]
        self.spares = [s for s in self.spares if s not in {s for s, _ in self.joining}]
        transport.regroup(self._group(epoch, members), members)
        log.warning("rank %d: going on with ranks %s (epoch %d)", self.rank, members, epoch)
        self.members, self.epoch = members, epoch
        return members

    def welcome(self, transport: Any, state: Any) -> None:
        """The survivors, at a round's end: the spares chosen join (a group of them all),
        and get `state` from the lowest survivor."""
        epoch = self.epoch + 1
        members = sorted([*self.members, *(s for s, _ in self.joining)])
        for spare, lost in self.joining:  # no later quorum chooses it again
            self.store.delete_key(f"spare/{spare}/ready")
            self.store.set(f"spare/{spare}", f"{epoch}:{lost}:{','.join(map(str, members))}")
        self._join(transport, epoch, members, state)

    def stand_by(self, transport: Any) -> tuple[int, Any] | None:
        """A spare: wait until chosen — (the lost rank whose place it takes, the state the
        survivors sent) — or until the run ends (None)."""
        self.store.set(f"spare/{self.rank}/ready", "1")
        key = f"spare/{self.rank}"
        while not self.store.check([key]):
            if self.store.check(["run/over"]):
                return None
            time.sleep(POLL_S)
        epoch, lost, members = self.store.get(key).decode().split(":")
        state = self._join(transport, int(epoch), [int(r) for r in members.split(",")], None)
        return int(lost), state

    def _join(self, transport: Any, epoch: int, members: list[int], state: Any) -> Any:
        group = self._group(epoch, members)
        transport.regroup(group, members)
        root = 0  # the lowest member: a survivor (a spare's rank is above every replica's)
        data = None
        if state is not None and members[0] == self.rank:
            out = io.BytesIO()
            torch.save(state, out)
            data = torch.frombuffer(bytearray(out.getvalue()), dtype=torch.uint8)
        size = torch.tensor([0 if data is None else data.numel()], dtype=torch.int64)
        group.broadcast(size, root).wait()
        data = data if data is not None else torch.empty(int(size), dtype=torch.uint8)
        group.broadcast(data, root).wait()
        self.members, self.epoch, self.joining, self.grouped = members, epoch, [], True
        log.warning("rank %d: ranks %s from here (epoch %d)", self.rank, members, epoch)
        if state is not None:
            return None
        sent = io.BytesIO(data.numpy().tobytes())
        return checkpoint.read(sent, f"the state rank {members[0]} sent")

    def release(self) -> None:
        """The run is over: spares still standing by end."""
        self.store.set("run/over", "1")
