"""Evaluation off the critical path: the server only copies θ at a fixed cadence; the
snapshots are evaluated after training, and each result is reported at the wall time the
snapshot was taken, so evaluation never costs the run any of its clock.

Memory holds a few snapshots whatever the run's length: past the last `KEEP`, each is
written behind to a file of the run directory (`Spill`, by a thread: the copy was the
run's cost, the write is not; at most `PENDING` wait for it) and read back one at a time
when evaluated."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import queue
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stalebench.config import EvalConfig

if TYPE_CHECKING:
    import torch
    from torch import nn

    from stalebench.data import Splits


# times compare as events.jsonl writes them (µs): an update logged at a grid time is in θ
TIME_DIGITS = 6


KEEP = 4  # the snapshots' copies of θ held in memory: the latest; the others are spilled
# copies handed to the writer and not yet written, at most: past them, `Spill.put` waits (a
# disk slower than the snapshots; the simulator's virtual time does not see it, a real
# run's recording rank does: snapshot less often)
PENDING = 4
SPILL = "snapshots.spill"  # in the run directory, while the run lasts


@dataclasses.dataclass(eq=False)
class Stored:
    """A copy of θ spilled (`Spill`): where it lies in the file, and the copy itself until
    the writer has written it."""

    spill: Spill
    offset: int
    numel: int
    dtype: Any
    pending: torch.Tensor | None

    def load(self) -> torch.Tensor:
        return self.spill.load(self)


@dataclasses.dataclass
class Snapshot:
    t: float
    version: int
    params: torch.Tensor | Stored

    def tensor(self) -> torch.Tensor:
        """θ of the snapshot, read back if it was spilled."""
        return self.params.load() if isinstance(self.params, Stored) else self.params


def _libc_trim() -> Any:
    """glibc's `malloc_trim`, where there is one: a freed copy of θ goes back to the system
    (past glibc's dynamic mmap threshold, a 16 MB copy is carved from the heap, which keeps
    what is freed: a run's memory crept up by 110 KB a snapshot without it). Called every
    KEEP + PENDING copies written, the memory freed meanwhile is bounded the same way."""
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM: Any = None


def trim() -> None:
    global _TRIM
    if _TRIM is None:
        _TRIM = _libc_trim() or (lambda _pad: 0)
    _TRIM(0)


class Spill:
    """Copies of θ appended to a file (`path`) by a writer thread; `load` reads one back.
    After a write error (a full disk, a file size limit) the copies stay in memory, as
    without a spill, and the run goes on (its log says why once): what it writes itself
    then fails as it would have."""

    def __init__(self, path: Path):
        self.path, self.end, self.made, self.written = Path(path), 0, False, 0
        self.queue: queue.Queue[Stored | None] = queue.Queue(maxsize=PENDING)
        self.error: Exception | None = None  # the writer's, once it failed: no more spills
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def put(self, params: torch.Tensor) -> Stored:
        if not self.made and self.error is None:  # the file, at the first copy spilled
            try:
                self.path.write_bytes(b"")
            except OSError as exc:
                self.failed(exc)
            self.made = True
        if self.error is not None:  # kept in memory
            return Stored(self, -1, params.numel(), params.dtype, params)
        if self.thread is None:
            self.thread = threading.Thread(target=self._write, name="spill", daemon=True)
            self.thread.start()
        size = params.numel() * params.element_size()
        stored = Stored(self, self.end, params.numel(), params.dtype, params)
        self.end += size
        self.queue.put(stored)
        return stored

    def _write(self) -> None:
        """The writer thread: each copy to its place, then freed. After an error (a full
        disk) the copies queued stay in memory, as every later one does (`put`)."""
        import torch

        f = None
        while (stored := self.queue.get()) is not None:
            if self.error is None:
                try:
                    f = f or open(self.path, "r+b")  # noqa: SIM115 (closed below)
                    f.seek(stored.offset)
                    f.write(stored.pending.cpu().view(-1).view(torch.uint8).numpy())
                    f.flush()
                except Exception as exc:  # an OSError; any other would hang `put`
                    self.failed(exc)
            if self.error is not None:
                continue
            with self.lock:
                stored.pending = None  # the copy is freed
            self.written += 1
            if self.written % (KEEP + PENDING) == 0:  # a trim costs ~25 ms on 16 MB copies
                trim()
        if f is not None:
            f.close()

    def failed(self, exc: Exception) -> None:
        self.error = exc
        logging.getLogger("stalebench").warning(
            "%s: %s: the snapshots stay in memory from here", self.path, exc
        )

    def load(self, stored: Stored) -> torch.Tensor:
        import torch

        with self.lock:
            if stored.pending is not None:  # not written yet (or not at all): still here
                return stored.pending
        params = torch.empty(stored.numel, dtype=stored.dtype)
        with open(self.path, "rb") as f:
            f.seek(stored.offset)
            f.readinto(params.view(torch.uint8).numpy())  # into θ's copy: no other
        return params

    def flush(self) -> None:
        """Wait until every copy put is written (or kept, after an error)."""
        if self.thread is not None:
            self.queue.put(None)
            self.thread.join()
            self.thread = None

    def close(self) -> None:
        """The run is evaluated (or has failed): the file goes."""
        self.flush()
        if self.made:
            with contextlib.suppress(OSError):
                self.path.unlink()


class Snapshots:
    """Copies of θ for the evaluation after training. An engine offers θ (`maybe`) at
    version 0 and after every change, with the run time of the change.

    Real runtime: a copy at the first offer, then at the first offer at or past each due time
    (`every_s` after the last copy) or due version (`every_updates` after it), each at the
    time it was offered, and once more at the end (`take`).

    Simulator (`on_grid`, with every_s > 0): a snapshot at every grid time k·every_s from 0 to
    the end, holding θ as it was then: the version applied last at or before that time. The
    time is virtual, so the simulator can afford what the real runtime cannot: it keeps the
    θ offered last, and a later offer emits the grid times before it with the θ held. Grid
    times that no update separates share one copy (and one evaluation). Every
    `every_updates` updates there is a copy at the update's time as well, and one at the
    run's end (the last grid time when the run ends on one). A method whose θ changes seldom
    (long BSP or DiLoCo rounds) is thus read at the same times as one that changes at every
    step, and a target reached between two grid times counts at the later one for both."""

    def __init__(self, cfg: EvalConfig, on_grid: bool = False, spill: Spill | None = None):
        self.cfg, self.spill = cfg, spill  # spill: where copies past the latest KEEP go
        self.in_memory = 0  # of `taken`, from here on the copies are in memory
        self.on_grid = on_grid and cfg.every_s > 0
        self.taken: list[Snapshot] = []
        self.next_version = 0
        self.next_t = 0.0
        self.held: Snapshot | None = None  # on_grid: θ as of the last offer
        self.next_grid = 0  # on_grid: k of the next grid time k·every_s to emit
        self._held_taken = False  # a snapshot shares the held copy: copy afresh next time

    def maybe(self, t: float, version: int, params: torch.Tensor) -> bool:
        """Take a snapshot if one is due; True when it did."""
        if self.on_grid:
            took = self._grid(t)
            self._hold(t, version, params)
            if self.cfg.every_updates > 0 and version >= self.next_version:
                took = self._add(t, version, self.held.params) or took
            return took
        due_v = self.cfg.every_updates > 0 and version >= self.next_version
        due_t = self.cfg.every_s > 0 and t >= self.next_t
        if due_v or due_t or not self.taken:
            self.take(t, version, params)
            return True
        return False

    def take(self, t: float, version: int, params: torch.Tensor) -> None:
        """A snapshot now (the run's end), unless the last one holds this version (on the
        grid: unless the last one is this time and version)."""
        if self.on_grid and self.held is not None:
            self._grid(t)
            if self.held.version == version:  # θ unchanged since the last offer
                params = self.held.params
        elif self.taken and self.taken[-1].version == version:
            return
        self._add(t, version, params)

    def grid_time(self, k: int) -> float:
        return round(k * self.cfg.every_s, TIME_DIGITS)

    def _grid(self, t: float) -> bool:
        """Emit the grid times before `t` with the θ held (none before the first offer)."""
        took, t = False, round(t, TIME_DIGITS)
        while self.grid_time(self.next_grid) < t:
            if self.held is not None:
                took = (
                    self._add(self.grid_time(self.next_grid), self.held.version, self.held.params)
                    or took
                )
            self.next_grid += 1
        return took

    def _hold(self, t: float, version: int, params: torch.Tensor) -> None:
        if self.held is not None and self.held.version == version:
            return  # θ unchanged
        if self.held is None or self._held_taken:
            self.held = Snapshot(t, version, params.detach().clone())
            self._held_taken = False
        else:
            self.held.params.copy_(params.detach())
            self.held.t, self.held.version = t, version

    def _add(self, t: float, version: int, params: torch.Tensor) -> bool:
        if self.taken and (self.taken[-1].t, self.taken[-1].version) == (t, version):
            return False
        if self.held is not None and params is self.held.params:
            self._held_taken = True
        else:
            params = params.detach().clone()
        self.taken.append(Snapshot(t, version, params))
        self.next_version = version + max(self.cfg.every_updates, 1)
        self.next_t = t + self.cfg.every_s
        self.keep_few()
        return True

    def keep_few(self) -> None:
        """Spill the copies of θ past the latest KEEP distinct ones in memory; snapshots that
        share a copy (grid times no update separates) share its place in the file, and are
        evaluated once."""
        taken, distinct, i = self.taken, 0, len(self.taken)
        while self.spill is not None and i > self.in_memory:
            i -= 1
            if i == len(taken) - 1 or taken[i].params is not taken[i + 1].params:
                distinct += 1
            if distinct > KEEP:
                break
        else:
            return
        last: tuple[Any, Stored] | None = None  # the copy spilled last, and where it went
        for snap in taken[self.in_memory : i + 1]:
            if snap.params.is_meta:  # a cost-only run's: no values, no memory
                continue
            if last is None or last[0] is not snap.params:
                last = (snap.params, self.spill.put(snap.params))
            snap.params = last[1]
        self.in_memory = i + 1


def objective(out: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """The training objective, chosen from the targets: least squares ½(f(x) − y)² for
    floating-point targets (regression), cross-entropy for integer labels; a sequence
    model's (B, T, classes) outputs count every position. `reduction`: mean or sum."""
    import torch

    if y.is_floating_point():
        squared = 0.5 * (out.reshape(y.shape) - y).square()
        return squared.mean() if reduction == "mean" else squared.sum()
    if y.dim() != 1 or out.dim() != 2:  # a sequence's positions, each a sample
        out, y = out.reshape(y.numel(), -1), y.reshape(-1)
    return torch.nn.functional.cross_entropy(out, y, reduction=reduction)


def evaluate(
    model: nn.Module, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, batch_size: int
) -> tuple[float, float | None]:
    """Mean `objective` and accuracy of `model` with flat parameters `params` on (x, y),
    computed where `model` is (each minibatch of (x, y) moved there; the sums stay there
    until the end, so a GPU is not stopped at every minibatch). A sequence model's
    (B, T, classes) outputs count every position: per-token loss and next-token accuracy.
    Regression (float targets) has no accuracy: None."""
    import torch
    from torch.nn.utils import vector_to_parameters

    device = next(model.parameters()).device
    vector_to_parameters(params.to(device), model.parameters())
    regression = y.is_floating_point()
    total_loss = torch.zeros((), dtype=torch.float64, device=device)
    correct, count = torch.zeros((), dtype=torch.int64, device=device), 0
    model.eval()
    with torch.no_grad():
        for start in range(0, len(y), batch_size):
            out = model(x[start : start + batch_size].to(device))
            target = y[start : start + batch_size].to(device)
            total_loss += objective(out, target, reduction="sum").double()
            if not regression:
                predicted = out.reshape(target.numel(), -1).argmax(1)
                correct += (predicted == target.reshape(-1)).sum()
            count += target.numel()
    model.train()
    return float(total_loss) / count, None if regression else int(correct) / count


def recalibrate_batch_norm(
    model: nn.Module, params: torch.Tensor, x: torch.Tensor, batch_size: int
) -> None:
    """Set BatchNorm running statistics for `params` from training data (the server never
    sees the workers' own statistics): reset them, then average over forward passes."""
    import torch
    from torch.nn.utils import vector_to_parameters

    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    device = next(model.parameters()).device
    vector_to_parameters(params.to(device), model.parameters())
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average over the passes below
    model.train()
    with torch.no_grad():
        for start in range(0, len(x), batch_size):
            model(x[start : start + batch_size].to(device))


def evaluate_snapshots(
    snapshots: list[Snapshot],
    model: nn.Module,
    splits: Splits,
    cfg: EvalConfig,
    seed: int,
    emit,
    device: torch.device | None = None,
) -> None:
    """Emit the held-out split's (and a fixed training subset's) loss and accuracy of every
    snapshot (accuracy None for regression): the test split, or the validation split when
    the splits hold one out (eval.split=val), never both. On `device` (the run's: a GPU
    run is evaluated on its GPU, on a copy of `model`); where `model` is when None."""
    import copy

    import torch

    if device is not None and next(model.parameters()).device != device:
        model = copy.deepcopy(model).to(device)

    sets = [splits.held_out]
    if cfg.train_samples:
        n = min(cfg.train_samples, len(splits.y_train))
        idx = torch.randperm(len(splits.y_train), generator=torch.Generator().manual_seed(seed))
        sets.append(("train", splits.x_train[idx[:n]], splits.y_train[idx[:n]]))
    # a language model (integer token targets per position): its perplexity too
    sequences = not splits.regression and splits.y_train.dim() > 1
    shared, results = None, []  # snapshots sharing one copy of θ (grid times): evaluated once
    for snap in snapshots:
        if snap.params is not shared:
            shared, params = snap.params, snap.tensor()  # a spilled copy: read back
            if cfg.train_samples:
                recalibrate_batch_norm(model, params, sets[1][1], cfg.batch_size)
            results = [(s, *evaluate(model, params, x, y, cfg.batch_size)) for s, x, y in sets]
        for split, loss, acc in results:
            extra = {"perplexity": math.exp(min(loss, 700.0))} if sequences else {}
            emit(
                "eval", snap.t, version=snap.version, split=split, loss=loss, accuracy=acc, **extra
            )
