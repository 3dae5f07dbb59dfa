"""The world one rank of a run sees, the same in both runtimes: its clock, its compute step
(the profile's time), its faults, point-to-point messages and collectives. This module is
the interface (`World`, `Listener`) and what every runtime shares; the real runtime's world
is `runtime.real.RealWorld`, the simulator's `runtime.sim.SimWorld`.

An engine writes each of its roles once, against a `World` (its life — the start, errors,
the ending — is the driver's: `runtime.driver`):

    class Replica(Role):
        def start(self):
            world.play(worker)  # the faults of the worker it plays

        def run(self):
            ...
            grad, compute_s = yield from world.compute(lambda: net.gradient_at(...))
            work = yield from world.isend(message, peer)
            waited_s = yield from world.recv(buf, peer)
            yield from world.all_reduce(buf)
            ...
            return Ending(...) if world.record else None

Every operation that may wait for another rank is a generator, taken with `yield from`
(`strike`, whose pauses wait for no one, is a plain call): in the real runtime
(`runtime.real`) it blocks over gloo and never suspends the program; in the simulator
(`runtime.sim`) it suspends the program until the event it waits for, on a virtual clock,
while the other ranks of the run go on in the same process. A program never asks which
runtime it is in.

The network is paid inside the world, as the network model says (`runtime.network`, one
model for both runtimes): a send the push direction's delay for its size (one send after
the other), a receive the pull direction's once the message is in, an all-reduce the ring's
time, each slowed by the rank's `slow` faults in force (`faults`, the worker's it plays:
`play`). A hub (a parameter server: `hub = True`) has one NIC for all its peers: the
messages that reach it queue on its downlink, its sends on its uplink. `wire_s` adds up
what this rank's messages and collectives took on the wire, for an engine to report; what
an engine exchanges only to measure (`seconds=0.0`) costs nothing.

A rank that hears from many peers in whatever order they send (a server) listens to them
(`listen`): the next message from any of them, a lost one's loss in its place.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from stalebench import placement
from stalebench.errors import RunError
from stalebench.runtime import checkpoint
from stalebench.runtime.faults import Faults

if TYPE_CHECKING:
    from stalebench.cluster import Profile
    from stalebench.metrics.events import EventLog
    from stalebench.runtime.network import Network
    from stalebench.runtime.record import RunRecord

T = TypeVar("T")
Op = Generator[Any, Any, T]  # what a world's waiting operation is: `yield from` it
Pause = Callable[[float, float], None]  # pause(at, seconds)


def nbytes(buf: torch.Tensor) -> int:
    return buf.numel() * buf.element_size()


def blocking(fn: Callable[..., T]) -> Callable[..., Op[T]]:
    """A real world's operation as a generator that never suspends, so that programs take
    every waiting operation with `yield from`, whichever runtime they run in."""

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> Op[T]:
        return fn(*args, **kwargs)
        yield  # unreachable: makes `op` a generator function

    return op


class World:
    """What one rank sees. `rank` and `size` place it in the run; `record` is the run
    directory on rank 0 (None elsewhere); `faults` the scheduled faults of the worker this
    rank plays (`play`: they strike its steps and slow its messages)."""

    rank: int
    size: int
    profile: Profile
    run_dir: Path  # the run directory (each rank's own, with torchrun across machines)
    record: RunRecord | None
    faults: Faults | None = None  # the worker's this rank plays (`play`)
    # a parameter server's rank: one NIC for all its peers, whose messages queue on it
    hub = False
    # the run's hubs, known to every rank once `begin` has passed: a message from a hub
    # costs its receiver the pull time, one from a peer only its downlink's queue
    hubs: frozenset[int] = frozenset()
    network: Network  # what messages and collectives cost (`runtime.network`)
    # where this rank computes (`stalebench.placement`): its host's GPU of its local rank, the
    # CPU, or the meta device in a cost-only run
    device: torch.device
    # seconds this rank's messages and collectives took on the wire so far, as modelled:
    # its sends' push time, its receives' pull time, its collectives' time (not what it
    # waited for the others); an engine reports communication from it
    wire_s = 0.0

    def now(self) -> float:
        """Run time: seconds since every rank started (real or virtual)."""
        raise NotImplementedError

    def placed(self) -> list[dict[str, Any]]:
        """Rank 0, at the end: each rank's host and device (summary.json's `ranks`)."""
        return [placement.placed(self.rank, self.device)]

    def play(self, worker: int, since: float = 0.0, step: int = 0, replaced: bool = False):
        """This rank plays `worker` from run time `since` and the worker's step `step` on
        (`replaced`: in a lost worker's place): the profile's faults of that worker strike
        its steps (`strike`) and slow its messages. They are kept with this rank's part of
        each checkpoint and are back, as they were, in a resumed run (`begin`)."""
        self.faults = Faults(self.profile, worker, since, step, replaced=replaced)

    @property
    def events(self) -> EventLog:
        """The run's events.jsonl, for a rank that writes its own events (rank 0's is
        `record.events`; the others append to the same file once `begin` has passed)."""
        raise NotImplementedError

    def shared(self, key: str, build: Callable[[], T]) -> T:
        """An object the ranks of this process share, built once (a real process holds one
        rank, the simulator all of them: one model to compute every rank's gradients)."""
        raise NotImplementedError

    def mailbox(self, src: int, dst: int, size: int, header: int) -> torch.Tensor:
        """A buffer for the messages `src` sends `dst` (this rank is one of them), read in
        place by the receiver (`Transport.mailbox`)."""
        return torch.zeros(size)

    def message(self, size: int, header: int) -> torch.Tensor:
        """A buffer for one message of `size` float32 slots this rank sends or receives; in
        a cost-only run its `header` slots alone, the wire charged for all `size`."""
        return torch.zeros(size)

    def begin(self, warm_up: Callable[[], Any]) -> Op[None]:
        """Every rank starts the run's clock together: at 0, or in a resumed run at its
        checkpoint's time, each rank then finding its part of a checkpoint set in `resumed`;
        `warm_up` (a first step, off the clock) runs before where it costs real time."""
        raise NotImplementedError

    # this rank's part of the checkpoint set the run goes on from (`checkpoint`), once
    # `begin` has passed; None in a run from the start, and for a rank that took no part
    # (lost before it, or a spare standing by): it stands by as a spare
    resumed: Any = None
    resumed_from = -1  # the version of that set (-1: a run from the start)
    every_s = 0.0  # run seconds between checkpoints (`checkpoint.every_s`); 0: none
    next_checkpoint = math.inf

    def checkpoint_due(self, t: float) -> bool:
        """Whether a checkpoint falls due at run time `t`: `every_s` after the last (or the
        start). Every rank that asks gets the same answer for the same `t`."""
        return t >= self.next_checkpoint

    def checkpoint_taken(self, t: float) -> None:
        """The checkpoint due by run time `t` is taken: the next falls due `every_s` after."""
        self.next_checkpoint = t + self.every_s

    def checkpoint(self, version: int, part: Any, t: float) -> Op[None]:
        """Every rank at once, at the same point of the run (a round's end, nothing in
        flight): `part`, what this rank needs to go on from here (its θ, optimizer state,
        worker; the random generator's state and the faults are added here), to the run
        directory; once every rank's part is on disk, rank 0 commits the set
        (`checkpoint.Checkpoints`), so that a kill at any moment leaves the last complete
        set. `t`: the run time the checkpoint was due by (the next falls due `every_s`
        after it). With cluster.min_replicas, over the ranks in the rounds (a lost one, or
        a spare standing by, takes no part)."""
        run_dir = self.run_dir
        saved = {"part": part, "rng": rng_state(), "faults": self.faults}
        checkpoint.save_part(run_dir, version, self.rank, saved)
        self.checkpoint_taken(t)
        barrier, ranks = torch.zeros(1), list(range(self.size))
        if self.profile.cfg.min_replicas:  # the ranks in the rounds: those that wrote a part
            ranks = yield from self.all_reduce_live(barrier, 0.0)
        else:
            yield from self.all_reduce(barrier, 0.0)
        if self.record is not None:
            state = {"parts": version, "due": t, "ranks": ranks}
            self.record.checkpoints.save(self.now(), version, state)
            checkpoint.prune_parts(run_dir, version)

    def _resume_from(self, version: int, due: float, ranks: list[int]) -> None:
        """`begin` in a resumed run (`version` ≥ 0: the checkpoint set's, which `ranks`
        wrote): this rank's part and random generator back, the next checkpoint `every_s`
        after the last."""
        self.next_checkpoint = due + self.every_s if self.every_s > 0 else math.inf
        self.resumed_from = version
        if version >= 0 and self.rank in ranks:
            saved = checkpoint.load_part(self.run_dir, version, self.rank)
            if "faults" not in saved:  # its rank's faults were the engine's to keep
                raise RunError(
                    f"resume: rank {self.rank}'s part of the checkpoint at version {version} "
                    "was written by an earlier stalebench, whose parts this one does not read: "
                    "run it again from the start, in a new run directory"
                )
            set_rng_state(saved["rng"])
            self.resumed, self.faults = saved["part"], saved["faults"]

    def _start_of(self) -> tuple[float, int, float, list[int]]:
        """Rank 0: when the run starts (a resumed run's checkpoint time), the version of
        its checkpoint set (-1: none, or a server's checkpoint), when the checkpoint fell
        due, and the ranks that wrote the set."""
        saved = self.record.resumed if self.record is not None else None
        if not saved:
            return 0.0, -1, 0.0, list(range(self.size))
        state = saved["state"]
        if not isinstance(state, dict) or "parts" not in state:  # a server's checkpoint
            return saved["t"], -1, saved["t"], list(range(self.size))
        return saved["t"], state["parts"], state["due"], state["ranks"]

    def strike(self, on_pause: Pause | None = None) -> float:
        """Strike this rank's faults due at its next step (`Faults.strike`): a pause calls
        `on_pause(at, seconds)`, then waits; a death raises `WorkerDied`. Returns the
        seconds paused. A plain call, not an operation to `yield from`: a pause waits for
        nothing another rank does (real processes sleep it; in the simulator it moves the
        rank's clock, and the rank's next waiting operation takes its turn)."""
        raise NotImplementedError

    def died_at(self, rank: int) -> float | None:
        """When `rank` died of an injected fault (run time), if it did: real processes say
        so before they end, so that a death just before the run's end, heard only after
        it, is still the run's loss; None in the simulator, which hears every loss at its
        time."""
        return None

    def compute(
        self, step: Callable[[], T], step_s: float, lazy: bool = False
    ) -> Op[tuple[T | None, float]]:
        """Run `step` (a gradient), lasting at least `step_s` (the profile's step time);
        returns its result and the seconds it took. `lazy`: the program does not use the
        result: `step` writes into the message this rank sends next and reads only what
        this rank's own steps change. The simulator then runs it when that message is first
        read, or before this rank's next step or collective, never if neither comes (a
        step under way when the run ends), and returns None for it; real processes run it
        now."""
        raise NotImplementedError

    def isend(self, buf: torch.Tensor, dst: int) -> Op[Any]:
        """Send `buf` to rank `dst` without waiting for it to arrive, after the push delay;
        `buf` stays unchanged until `wait` on the returned handle."""
        raise NotImplementedError

    def wait(self, work: Any, dst: int) -> Op[None]:
        """Wait until the send `work` to `dst` is delivered."""
        raise NotImplementedError

    def send(self, buf: torch.Tensor, dst: int) -> Op[None]:
        """`isend`, then `wait`."""
        yield from self.wait((yield from self.isend(buf, dst)), dst)

    def recv(self, buf: torch.Tensor, src: int, patient: bool = False) -> Op[float]:
        """Receive the next message from rank `src` into `buf`, then pay the pull delay;
        returns the seconds waited for the message to arrive (not counting the delay). It
        waits at most timeout_s, or as long as the run lasts when `patient` (a spare)."""
        raise NotImplementedError

    def listen(self, peers: dict[int, int], make: Callable[[int], list[torch.Tensor]]):
        """A `Listener` to `peers` (the program's name for each → its rank); `make(rank)`
        gives the buffers a message from that rank is received into."""
        raise NotImplementedError

    def all_reduce(
        self, buf: torch.Tensor, seconds: float | None = None, wait: bool = True,
        nbytes: int | None = None,
    ) -> Op[Any]:  # fmt: skip
        """Sum `buf` over every rank, in place (the simulator sums in rank order); it lasts
        the network's ring all-reduce time for `nbytes` (what the wire carries; default
        `buf`'s size), as slowed by this rank's faults, from this rank's start — or
        `seconds` when given (0: the harness's own exchange, free; or a time the runtime
        worked out, `pieces`) — or the real transfer's if that is longer. Returns the
        seconds this rank waited for it; with `wait=False`, at once a handle for `complete`,
        the collective going on while the rank computes (`buf` untouched until then). A
        rank's collectives run in the order it starts them (`collectives_end`)."""
        raise NotImplementedError

    def collectives_end(self) -> float:
        """The run time at which this rank's collectives started so far end, as the
        network model has them (not waiting for the other ranks)."""
        raise NotImplementedError

    def exchange_s(self, nbytes: int) -> float:
        """The price of an exchange a step makes inside itself (a model-parallel layer's
        activations: `engines.allreduce.hybrid`): the network model's all-gather of `nbytes`
        from each rank, as slowed by this rank's faults; the step waits it out."""
        return self.network.allgather_s(nbytes, self._slow_s())

    def _slow_s(self) -> float:
        """What the `slow` faults in force add to each message this rank sends."""
        return self.faults.slow_s if self.faults is not None else 0.0

    def _priced(self, seconds, size: int | None, price, buf=None) -> float | None:
        """A collective's seconds: `seconds` as given, else the network's `price` of `size`
        bytes on the wire (default: `buf`'s size) as slowed by this rank's faults; None
        when neither is given (the transport prices its buffer itself)."""
        if seconds is not None:
            return seconds
        if size is None and buf is not None:
            size = nbytes(buf)
        return None if size is None else price(size, self._slow_s())

    def all_reduce_live(
        self, buf: torch.Tensor, seconds: float | None = None, wait: bool = True,
        nbytes: int | None = None,
    ) -> Op[Any]:  # fmt: skip
        """`all_reduce` over the ranks still alive: a rank lost before or during it (dead,
        or silent past timeout_s) is left out, the others agreeing on who is left (a quorum)
        and summing their buffers as they brought them — unless a survivor had completed
        it before the loss (real processes: the lost rank's data had reached it), when
        every survivor takes that sum, over the ranks it had. Returns the ranks summed, in
        order; a rank itself left out (silent too long) gets a RunError. Every rank of the
        run calls it, the same number of times, as it does `all_reduce`. With `wait=False`,
        a handle for `complete` (its `members`, the ranks summed, once complete): a loss
        found while several are under way sums again, over the ranks left, every one of
        them not yet complete, in the order they were started."""
        raise NotImplementedError

    # spares chosen by the last `all_reduce_live` to take lost ranks' places: (spare rank,
    # the lost rank), each to join at the survivors' next `welcome`
    joining: list[tuple[int, int]] = []

    def welcome(self, state: Any) -> Op[None]:
        """The survivors, at the end of a round whose `all_reduce_live` chose spares
        (`joining`): the rounds from here run over them and those spares, which get `state`
        (a picklable object, from the lowest survivor)."""
        raise NotImplementedError

    def invite(self, vacant: list[int]) -> bool:
        """Rank 0, before a round of live collectives: whether ranks stand by to fill the
        `vacant` places (lost ranks whose workers no rank plays; a rank left out and back
        takes its own, a spare the others); if so they are chosen, to join at the
        `welcome` after the round in whose order rank 0 says so (`invited`)."""
        return False

    def invited(self) -> None:
        """Every rank in the rounds, told by rank 0's order: the ranks it invited are
        `joining`, to be welcomed after this round."""
        raise NotImplementedError

    def stand_by(self) -> Op[tuple[int, Any] | None]:
        """A spare (after `begin`), or a rank left out and back (`LeftOut`): off the rounds
        until chosen to take a lost rank's place — returns (that rank, the state `welcome`
        sent) — or until the run ends (None)."""
        raise NotImplementedError

    def release_spares(self) -> None:
        """Rank 0, at the end: the spares still standing by end."""

    def all_gather(
        self, out: list[torch.Tensor], buf: torch.Tensor, seconds: float | None = None,
        wait: bool = True, nbytes: int | None = None,
    ) -> Op[Any]:  # fmt: skip
        """Every rank's `buf` into `out` (one tensor per rank, in rank order), as
        `all_reduce` (its time: the network's ring all-gather of `nbytes` per rank)."""
        raise NotImplementedError

    def complete(self, handle: Any) -> Op[float]:
        """Wait for a collective started with `wait=False`; the seconds waited."""
        raise NotImplementedError

    def pieces(
        self, buf: torch.Tensor, bounds: list[tuple[int, int]], order: list[int],
        ready: list[float], forward: list[tuple[float, list[int]]] | None = None,
        spans: list[list[tuple[int, int, int, int]]] | None = None,
        sizes: list[int] | None = None,
    ) -> Any:  # fmt: skip
        """A round's all-reduce of `buf` in pieces (`bounds`: their ranges), each issued once
        it is written and the pieces before it in `order` (the same on every rank) are.
        With `hooked` true (real processes, `runtime.link.Pieces`) a compute step's backward
        hooks `post(k, round)` each piece as it is made; `wait(k)` waits for a piece's sum
        at once (inside a step), `settle()` (an op) for every piece of the round,
        `waited` counts the seconds waited, `close()` waits for what is under way. On a
        virtual clock a step takes no time and nothing is posted (`hooked` false): the
        round is one all-reduce of `buf` lasting `comm_s(step_s, slow_s)` past the step,
        what the pieces, made at `ready` (fractions of the step) and all-reduced one after
        another in `order`, would take — or, given `forward` (P3: each module's share of a
        step in the forward pass, in its order, and the pieces holding its tensors), what
        the next forward pass waits for them; `wait` is refused. `spans`: each piece's
        (tensor, first element, end, the tensor's elements), where a sharded parameter
        server places its keys by tensor (`Network.piece_ends`); `sizes`: the bytes each
        piece carries on the network, where not all of its range (tensors that stay where
        they are, such as model-parallel layers' gradients)."""
        raise NotImplementedError

    def pace(self, net: torch.nn.Module, params: list[torch.Tensor], work=None) -> Any:
        """Hooks on `net` that spread a step's modelled time over its forward and backward
        passes, by each tensor's `work` (default: its size), so that pieces posted from
        backward overlap the modelled computation (`runtime.link.Pace`: `start(step_s)`,
        `backward()`); None where a step takes no time (the simulator)."""
        return None


class Listener:
    """A rank's ear to its peers (`World.listen`)."""

    def next(
        self, active: set[int], until: float = 0.0, read: bool = True
    ) -> Op[tuple[int, list] | None]:
        """The next message from a peer in `active`: (peer, its buffers, read in place until
        the reply to it); None when run time `until` (> 0) passes first. A lost or silent
        peer raises `WorkerLost` (a real peer silent for timeout_s after `arm`). `read`:
        False when the caller will not read the message (it only learns who sent one)."""
        raise NotImplementedError

    def arm(self, peer: int) -> None:
        """This rank awaits the peer's next message (it replied): its silence counts."""

    def close(self, peer: int) -> None:
        """No longer listen to the peer (told to stop, or lost)."""

    def replace(self, peer: int, rank: int) -> None:
        """The peer is rank `rank` from now on (a spare in a lost worker's place)."""


def rng_state() -> dict[str, Any]:
    """The process's random generators (dropout draws from them), for a checkpoint."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return {"cpu": torch.get_rng_state(), "cuda": cuda}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
