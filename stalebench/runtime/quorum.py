"""The replicas of a serverless run that are still alive, a gloo group over them, the
rounds they sum, and the spares that take lost replicas' places.

gloo cannot shrink a process group, so when a collective fails (a peer died, or was silent
past timeout_s) the survivors make a new one, as torchft's Manager does per quorum: each
registers in the run's store under the next epoch (which also stops the others' waits:
`check`), waits until every member of the current group has registered or is known dead
(the supervisor marks each rank that exits with an error: `dead/<rank>`), at most
timeout_s, and the first to finish waiting writes the members it saw, with the spares
standing by that are to take the lost ones' places; every rank reads that (`compare_set`),
so all agree. A rank left out (it came after the wait: silent too long) gets `LeftOut`,
and stands by as a spare of its own place.
The new group meets over a prefix of the same store. gloo's group formation would wait
timeout_s for a member that died after it was counted; it runs in a thread, watched from
here: a member marked dead, or a later regroup begun, abandons it (`Lost`: regroup again).

Then, before summing again, the survivors commit (torchft's `should_commit`; `Rounds`). A
loss inside an all-reduce can leave them out of step: gloo's ring completes at the ranks
that the lost one's data had reached and fails at the others, and those that completed go
on to their next round. Every rank starts its live collectives in the same order, so the
count it started before one is that collective's round. Each survivor publishes how many
it has taken and, for those under way and the last few taken, their rounds, sizes and
fingerprints; all read all (`agree`). A round some survivor completed is not summed again:
the lowest of them broadcasts the sum it got (over that round's ranks, the lost one
included) and the others take it, its checksum checked. The rounds none completed are
summed again over the survivors from what each brought, in order; their sizes are checked
first, and each new sum against the sums of what the survivors brought (the values of a
sum add up to the sum of the buffers' totals, to float rounding), so two rounds out of
step are never summed together. A member lost meanwhile makes them regroup again.
Survivors that cannot agree fail with a RunError naming the ranks lost.

Spares and ranks back that stand by while places are vacant are taken in without a failure
too: the lowest survivor chooses them (`invite`: a rank back takes its own place) and its
round's order tells the others (`invited`), so that all welcome them after the same round.

At a round's end the survivors `welcome` the spares chosen: a group over them all, and the
state the program hands over, broadcast from the lowest survivor. A loss while spares join
is not recovered: the run fails, naming the ranks lost.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import math
import threading
import time
import zlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from stalebench.errors import RunError
from stalebench.runtime import checkpoint
from stalebench.runtime.transport import brief

log = logging.getLogger("stalebench")

POLL_S = 0.01
# how often the lowest survivor looks in the store for ranks standing by while places are
# vacant (`invite`): a few store requests, off every round but one in this many seconds
INVITE_POLL_S = 0.1


def mark_dead(store: dist.Store, rank: int) -> None:
    """The supervisor's word that `rank` exited with an error: no quorum waits for it."""
    store.set(f"dead/{rank}", "1")


class Lost(RunError):
    """A member lost while the survivors regroup (dead, silent past timeout_s, or another
    rank has begun the next regroup): they regroup again."""


class LeftOut(RunError):
    """This rank came to the rounds after the others had gone on without it (silent past
    timeout_s): it may be taken back in, as a spare of its own place."""


class RoundsFailed(RunError):
    """The survivors cannot go on together (the message names the ranks lost); `left`: the
    members not known dead, for the program to log the others lost."""

    def __init__(self, message: str, left: list[int]):
        super().__init__(message)
        self.left = left


class Quorum:
    """This rank's view: the members of the current group (ranks), its epoch, the spares
    chosen to join at the next `welcome` ((spare, lost rank) pairs), the ranks lost."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout_s: float, active: int):
        self.store, self.rank, self.timeout_s, self.size = store, rank, timeout_s, size
        self.active = active  # the ranks of the workers; those after them: the spares
        self.members, self.epoch = list(range(active)), 0  # the ranks in rounds from the start
        self.spares = list(range(active, size))
        self.grouped = active == size  # with spares, the rounds' first group leaves them out
        self.joining: list[tuple[int, int]] = []
        self.group: Any = None  # the current group's, once regrouped (None: the default)
        self.lost: list[int] = []  # the ranks left out of the rounds, in order
        self.invites, self.inviting = 0, False  # invitations heard; one under way (`invite`)
        self.looked = -math.inf  # when `invite` last looked in the store (monotonic)

    def resume(self, members: list[int]) -> None:
        """A resumed run: the rounds go on over `members` (those in the checkpoint set);
        the other ranks stand by as spares."""
        self.members = list(members)
        self.spares = [r for r in range(self.size) if r not in members]
        self.grouped = not self.spares

    def _group(self, epoch: int, members: list[int], name: str = "group", regroup: int = -1):
        """A gloo group of `members` over the store's prefix `quorum/<epoch>/<name>`, made in
        a thread and watched (gloo would wait timeout_s for a member that died after it was
        counted): `Lost` if a member is lost first, or epoch `regroup` (default: the next)
        opens."""
        made: dict[str, Any] = {}
        side = self.store.clone()  # gloo holds its client while it waits: not the watcher's

        def build() -> None:
            try:
                made["group"] = dist.ProcessGroupGloo(
                    dist.PrefixStore(f"quorum/{epoch}/{name}", side),
                    members.index(self.rank),
                    len(members),
                    timedelta(seconds=self.timeout_s),
                )
            except Exception as exc:  # gloo's timeout or a refused connection: said below
                made["error"] = exc

        thread = threading.Thread(target=build, name=f"quorum-{epoch}", daemon=True)
        thread.start()
        self.watch(lambda: not thread.is_alive(), members, epoch + 1 if regroup < 0 else regroup)
        if "error" in made:
            raise Lost(f"the group of ranks {members} did not form: {brief(made['error'])}")
        return made["group"]

    def watch(self, done: Callable[[], bool], members: list[int], regroup: int) -> None:
        """Wait until `done()` while `members` regroup: `Lost` at once when one of them is
        marked dead or epoch `regroup` opens (another rank regroups again), and after
        timeout_s (one of them silent)."""
        deadline = time.monotonic() + self.timeout_s
        while not done():
            dead = [r for r in members if self.store.check([f"dead/{r}"])]
            if dead:
                raise Lost(f"rank {', '.join(map(str, dead))} lost while the ranks regroup")
            if self.store.check([f"quorum/{regroup}/open"]):
                raise Lost("another rank regroups again")
            if time.monotonic() > deadline:
                raise Lost(f"ranks {members} silent past timeout_s={self.timeout_s:g}")
            time.sleep(POLL_S)

    def start(self, transport: Any) -> None:
        """Before the first round: with spares standing by, a group of the others."""
        if not self.grouped:
            self.group = self._group(0, self.members)
            transport.regroup(self.group, self.members)
            self.grouped = True

    def check(self) -> None:
        """Raise if another rank has begun to regroup (its collective failed): this one's
        cannot complete either, but gloo would say so only after timeout_s."""
        if self.store.check([f"quorum/{self.epoch + 1}/open"]):
            raise RunError("another rank lost a peer and regroups")

    def reform(self, transport: Any, cause: Exception) -> list[int]:
        """After `cause` (a failed collective): agree with the other survivors on who is
        left (and which spares take the lost ones' places: those chosen before and not yet
        welcomed keep theirs), point `transport`'s collectives at a group of the survivors;
        returns them. `Lost` if one of them is lost before the group forms."""
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
        pairs = [*self.joining, *zip(ready, lost, strict=False)]
        seen = ",".join(map(str, came)) + "|" + ",".join(f"{s}:{r}" for s, r in pairs)
        agreed = store.compare_set(prefix + "members", "", seen).decode()
        left, chosen = agreed.split("|")
        members = [int(r) for r in left.split(",")]
        if self.rank not in members:
            raise LeftOut(
                f"rank {self.rank} was left out of the replicas that went on (it came after "
                f"timeout_s={self.timeout_s:g}; the round failed with: {cause})"
            )
        self.lost += [r for r in self.members if r not in members]
        self.choose(chosen)
        self.members, self.epoch = members, epoch  # a loss from here: the next epoch
        self.group = self._group(epoch, members)
        transport.regroup(self.group, members)
        log.warning("rank %d: going on with ranks %s (epoch %d)", self.rank, members, epoch)
        return members

    def choose(self, pairs: str) -> None:
        """The spares (spare:lost rank pairs, comma-separated) to join at the next
        `welcome`, beside those chosen already: no later choice takes them again."""
        taken = {s for s, _ in self.joining}
        chosen = [tuple(map(int, p.split(":"))) for p in pairs.split(",") if p]
        self.joining += [(s, r) for s, r in chosen if s not in taken]
        self.spares = [s for s in self.spares if s not in {s for s, _ in self.joining}]

    def invite(self, vacant: list[int]) -> bool:
        """The lowest survivor, before a round: the ranks standing by to fill `vacant`
        places (lost ranks whose workers no rank plays) — a rank back its own, the
        cluster's spares the others in order —, kept in the store for `invited`; whether
        there are any. None while spares chosen before have not joined, or its last
        invitation is unheard, or it looked less than INVITE_POLL_S ago. (A resumed run's
        worker rank that took no part in its checkpoint was lost before it: it stays out,
        as in the run uninterrupted.)"""
        if self.joining or self.inviting or time.monotonic() - self.looked < INVITE_POLL_S:
            return False
        self.looked = time.monotonic()
        ready = [s for s in self.spares
                 if s >= self.active and self.store.check([f"spare/{s}/ready"])]  # fmt: skip
        pairs = []
        for rank in vacant:
            if rank not in self.spares and self.store.check([f"spare/{rank}/ready"]):
                pairs.append((rank, rank))
            elif ready:
                pairs.append((ready.pop(0), rank))
        if pairs:
            self.inviting = True
            key = f"quorum/invite/{self.invites}"
            self.store.set(key, ",".join(f"{s}:{r}" for s, r in pairs))
        return bool(pairs)

    def invited(self) -> list[tuple[int, int]]:
        """Every survivor, told by the lowest's order: the ranks it invited join at the
        round's `welcome`."""
        self.choose(self.store.get(f"quorum/invite/{self.invites}").decode())
        self.invites, self.inviting = self.invites + 1, False
        return self.joining

    def exchange(self, mine: dict[str, Any]) -> dict[int, dict[str, Any]]:
        """Every member's record (this rank's: `mine`), through the store, once all wrote."""
        prefix = f"quorum/{self.epoch}/rounds/"
        self.store.set(prefix + str(self.rank), json.dumps(mine))
        keys = [prefix + str(r) for r in self.members]
        self.watch(lambda: self.store.check(keys), self.members, self.epoch + 1)
        return {r: json.loads(self.store.get(k)) for r, k in zip(self.members, keys, strict=True)}

    def broadcast(self, buf: torch.Tensor, source: int) -> None:
        """`buf` from member `source` to every member, over the current group."""
        work = self.group.broadcast(buf, self.members.index(source))
        self.watch(work.is_completed, self.members, self.epoch + 1)
        try:
            work.wait()
        except Exception as exc:
            raise Lost(f"a broadcast from rank {source} failed: {brief(exc)}") from exc

    def named(self, why: str) -> RoundsFailed:
        """The rounds cannot go on: `why`, and every rank lost (those left out so far, and
        the members marked dead since)."""
        left = [r for r in self.members if not self.store.check([f"dead/{r}"])]
        lost = [*self.lost, *(r for r in self.members if r not in left)]
        return RoundsFailed(f"{why} (lost: ranks {', '.join(map(str, lost)) or 'none'})", left)

    def welcome(self, transport: Any, state: Any, round_: int, due: float) -> None:
        """The survivors, at a round's end: the spares chosen join (a group of them all),
        and get `state` from the lowest survivor, `round_` (the live collectives started so
        far) and `due` (when the next checkpoint falls due)."""
        epoch = self.epoch + 1
        members = sorted([*self.members, *(s for s, _ in self.joining)])
        ranks = ",".join(map(str, members))
        spares = ",".join(map(str, self.spares))  # still standing by, for the joiners' quorums
        for spare, lost in self.joining:  # no later quorum chooses it again
            self.store.delete_key(f"spare/{spare}/ready")
            self.store.set(f"spare/{spare}", f"{epoch}:{lost}:{ranks}:{round_}:{self.invites}:"
                           f"{spares}:{due!r}")  # fmt: skip
        try:
            self._join(transport, epoch, members, state)
        except Lost as exc:
            raise self.named(f"a replica was lost while spares joined: {exc}") from exc

    def stand_by(self, transport: Any) -> tuple[int, Any, int, float] | None:
        """A spare: wait until chosen — (the lost rank whose place it takes, the state the
        survivors sent, the live collectives they started so far, when their next
        checkpoint falls due) — or until the run ends (None)."""
        key = f"spare/{self.rank}"
        self.store.delete_key(key)  # a rank back: its word of an earlier join is stale
        self.store.set(f"{key}/ready", "1")
        while not self.store.check([key]):
            if self.store.check(["run/over"]):
                return None
            time.sleep(POLL_S)
        word = self.store.get(key).decode()
        epoch, lost, members, round_, invites, spares, due = word.split(":")
        ranks = [int(r) for r in members.split(",")]
        self.invites, self.inviting, self.joining = int(invites), False, []
        self.spares = [int(s) for s in spares.split(",") if s]
        try:
            state = self._join(transport, int(epoch), ranks, None)
        except Lost as exc:
            raise self.named(f"a replica was lost while this spare joined: {exc}") from exc
        return int(lost), state, int(round_), float(due)

    def _join(self, transport: Any, epoch: int, members: list[int], state: Any) -> Any:
        group = self._group(epoch, members, "welcome", regroup=epoch)
        transport.regroup(group, members)
        root = 0  # the lowest member, rank 0: a survivor (the run fails without it)
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


@dataclasses.dataclass(eq=False)
class Live:
    """A rank's `all_reduce_live` (`Rounds`): its buffer, what the rank brought (once taken,
    the sum, kept for survivors that did not complete it), its priced seconds, the
    collective under way, its round (the live collectives this rank started before it: the
    same on every rank); once taken, the ranks it summed and the spares chosen to join
    after it."""

    buf: torch.Tensor
    brought: torch.Tensor
    seconds: float | None
    pending: Any
    round: int
    members: list[int] = dataclasses.field(default_factory=list)
    joining: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    expect: tuple[float, float] | None = None  # summed again: its values' total, ± rounding
    # where the sum is made: `buf`, or after a regroup a buffer of its own (the collective
    # left behind on the old group may still write into `buf` as its last data comes in)
    into: torch.Tensor | None = None


class Rounds:
    """A rank's live collectives: those under way, in the order started, and the last few
    taken, each with its sum (as many as were ever under way at once: a survivor that did
    not complete a round another did has it under way still, so no more can be asked for).
    `begin(buf, seconds)` starts an all-reduce over the current group (the profile's)."""

    def __init__(self, quorum: Quorum, transport: Any, begin: Callable[..., Any]):
        self.quorum, self.transport, self.begin = quorum, transport, begin
        self.live: list[Live] = []
        self.taken: list[Live] = []
        self.free: list[torch.Tensor] = []  # the sums no longer kept: buffers to bring in
        self.started, self.depth = 0, 1
        self.joining: list[tuple[int, int]] = []  # chosen by the last taken, until welcome

    def reset(self, started: int) -> None:
        """A rank joining the rounds (a spare, or a rank back): none under way or kept; the
        survivors had started `started`."""
        self.live, self.taken, self.joining, self.started, self.depth = [], [], [], started, 1

    def start(self, buf: torch.Tensor, seconds: float | None) -> Live:
        self.quorum.start(self.transport)
        self.transport.watch(self.quorum.check)
        live = Live(buf, self.bring(buf), seconds, self.begin(buf, seconds), self.started)
        self.started += 1
        self.live.append(live)
        self.depth = max(self.depth, len(self.live))
        return live

    def settle(self, handle: Live) -> None:
        """Wait for the collectives under way, in order, up to `handle`; when one fails
        (a peer lost), `regroup`."""
        while handle in self.live:
            first = self.live[0]
            try:
                first.pending.wait()
            except RunError as exc:
                self.regroup(exc)
                continue
            self.take(first, self.quorum.members, self.quorum.joining)

    def take(self, live: Live, members: list[int], joining: list[tuple[int, int]]) -> None:
        """`live` is complete, summed over `members`: its sum is kept."""
        self.live.remove(live)
        live.members, live.joining = list(members), list(joining)
        if live.into is not None:
            live.buf.copy_(live.into)
            live.into = None
        if live.expect is not None:
            total, bound = live.expect
            got = float(live.buf.sum(dtype=torch.float64))
            if not abs(got - total) <= bound:
                raise self.quorum.named(
                    f"round {live.round}, summed again over ranks {members}, adds up to "
                    f"{got:.9g} where the buffers they brought add up to {total:.9g}: summed "
                    "out of step"
                )
        live.brought.copy_(live.buf)
        self.taken.append(live)
        while len(self.taken) > self.depth:
            self.free = [*self.free, self.taken.pop(0).brought][-self.depth :]
        self.joining = live.joining

    def bring(self, buf: torch.Tensor) -> torch.Tensor:
        """A copy of `buf`, into a sum no longer kept where one fits (a copy costs a third
        of an allocation's clone)."""
        for i, free in enumerate(self.free):
            if free.shape == buf.shape and free.dtype == buf.dtype:
                return self.free.pop(i).copy_(buf)
        return buf.clone()

    def regroup(self, cause: Exception) -> None:
        """After `cause` (a failed collective): agree on the ranks left (`Quorum.reform`),
        then on the rounds (`commit`); again while a member is lost meanwhile."""
        while True:
            try:
                self.quorum.reform(self.transport, cause)
                self.commit()
                return
            except Lost as exc:
                cause = exc

    def commit(self) -> None:
        """The survivors' rounds in step: those some completed handed to the others, those
        none completed started again over the survivors (`agree`)."""
        quorum = self.quorum
        mine = {
            "taken": self.started - len(self.live),
            "live": [[x.round, *_shape(x.brought), *_sums(x.brought)] for x in self.live],
            "kept": [
                [x.round, *_shape(x.brought), _checksum(x.brought), x.members, x.joining]
                for x in self.taken
            ],
        }
        try:
            handed, expect = agree(quorum.exchange(mine))
        except Lost:
            raise
        except RunError as exc:
            raise quorum.named(str(exc)) from exc
        for h in handed:
            live = self.live[0] if self.live and self.live[0].round == h.round else None
            kept = next((x.brought for x in self.taken if x.round == h.round), None)
            buf = kept if quorum.rank == h.source else torch.empty(h.numel, dtype=_dtype(h.dtype))
            quorum.broadcast(buf, h.source)
            if live is None:
                continue
            if _checksum(buf) != h.checksum:
                raise quorum.named(f"round {h.round} from rank {h.source} came corrupted")
            live.into = buf.view(live.buf.shape)  # it came flat: the round's own shape
            self.take(live, h.members, h.joining)
            log.warning(
                "rank %d: round %d taken from rank %d, which completed it over ranks %s",
                quorum.rank, h.round, h.source, h.members,
            )  # fmt: skip
        for again in self.live:
            again.into = again.brought.clone()
            again.pending = self.begin(again.into, again.seconds)
            again.expect = expect.get(again.round)
        if self.live:
            log.warning(
                "rank %d: rounds %s summed again over ranks %s", quorum.rank,
                [x.round for x in self.live], quorum.members,
            )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Handover:
    """A round some survivors completed and others did not: `source` broadcasts its sum."""

    round: int
    source: int
    numel: int
    dtype: str
    checksum: int
    members: list[int]
    joining: list[tuple[int, int]]


def agree(records: dict[int, dict[str, Any]]) -> tuple[list[Handover], dict[int, Any]]:
    """What the survivors' records (`Rounds.commit`: each rank's count of live collectives
    taken; round, size and sums of those under way; round, size, checksum, ranks and spares
    of those kept) say: the rounds some completed, each handed over by the lowest survivor
    that kept its sum; and for each round under way at every survivor, what its sum over
    them must add up to, and by how much float rounding may miss it. A RunError when they
    cannot agree."""
    ranks = sorted(records)
    taken = {r: records[r]["taken"] for r in ranks}
    live = {r: {e[0]: e[1:] for e in records[r]["live"]} for r in ranks}
    kept = {r: {e[0]: e[1:] for e in records[r]["kept"]} for r in ranks}

    def fail(why: str) -> RunError:
        return RunError(f"ranks {ranks} cannot agree on their rounds: {why}")

    handed = []
    for round_ in range(min(taken.values()), max(taken.values())):
        source = next((r for r in ranks if taken[r] > round_ and round_ in kept[r]), None)
        if source is None:
            holders = [r for r in ranks if taken[r] > round_]
            raise fail(f"round {round_} was completed by ranks {holders}, none of which kept it")
        numel, dtype, checksum, members, joining = kept[source][round_]
        if joining:  # its spares were welcomed by those that completed it
            raise fail(f"spares were chosen in round {round_}, which only some completed")
        for r in ranks:
            if taken[r] <= round_ and live[r].get(round_, [None, None])[:2] != [numel, dtype]:
                raise fail(f"rank {r} has no round {round_} of {numel} {dtype} under way")
        handed.append(Handover(round_, source, numel, dtype, checksum, members, joining))
    expect = {}
    for round_ in sorted({n for r in ranks for n in live[r] if n >= max(taken.values())}):
        entries = [live[r][round_] for r in ranks if round_ in live[r]]
        if len({(numel, dtype) for numel, dtype, *_ in entries}) > 1:
            raise fail(f"round {round_} under way with sizes {[e[:2] for e in entries]}")
        total, magnitude = sum(e[2] for e in entries), sum(e[3] for e in entries)
        if len(entries) == len(ranks) and math.isfinite(total) and math.isfinite(magnitude):
            numel, dtype = entries[0][:2]
            eps = torch.finfo(_dtype(dtype)).eps  # each value's sum rounded; then the totals
            expect[round_] = (total, (len(ranks) * eps + numel * 2.0**-52) * magnitude)
    return handed, expect


def _shape(buf: torch.Tensor) -> list[Any]:
    return [buf.numel(), str(buf.dtype)]


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.removeprefix("torch."))


def _sums(buf: torch.Tensor) -> list[float]:
    """A buffer's fingerprint that a sum keeps: its total, and its magnitude (the bound)."""
    return [float(buf.sum(dtype=torch.float64)), float(buf.abs().sum(dtype=torch.float64))]


def _checksum(buf: torch.Tensor) -> int:
    return zlib.crc32(buf.contiguous().view(-1).view(torch.uint8).numpy())
