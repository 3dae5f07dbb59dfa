"""What a checkpoint's state.pt says of itself, read without torch: a resume=true that
cannot go on is refused before the CLI imports torch or reads the dataset.

A torch.save file is a zip archive whose `data.pkl` holds the object with its tensors'
storages kept apart (persistent ids). `peek` reads that pickle with an unpickler that
resolves no global and calls nothing: every class or function the file names becomes an
inert placeholder, so what comes back is the plain data around them (a checkpoint's
`config_sha`), and the names themselves. Whether the state may be loaded is still
torch's weights-only loader's to say (`checkpoint.read`); this only refuses early what it
would refuse too: a file that is not such an archive, one cut short, a state of another
config, and a pickle naming a standard-library callable no checkpoint holds (`io.open`,
`os.system`).
"""

from __future__ import annotations

import io
import json
import pickle
import sys
import zipfile
from pathlib import Path
from typing import IO, Any

from stalebench.errors import BadCheckpoint, RunError
from stalebench.registry import STORED

DIR = "checkpoint"  # of the run directory
CONFIG = "config.json"  # {"config_sha": ...}: the config of the run whose checkpoint it is
HEAD = b"PK\x03\x04"  # how every file torch.save writes begins (a zip archive)
# what of the standard library a checkpoint may name: what torch's weights-only loader
# rebuilds (containers, bytes as protocol 2 writes them) and a barrier's random stream;
# with the classes marked `stored` (stalebench.registry.STORED) that are registered by then
STDLIB_DATA = frozenset({
    "_codecs.encode", "builtins.bytearray", "builtins.complex", "builtins.set",
    "collections.Counter", "collections.OrderedDict", "random.Random",
})  # fmt: skip


class Unreadable(RunError):
    """A checkpoint file that holds what the safe loader refuses, or cannot be read."""


def container_fault(source: Path | IO[bytes], start: int = 0) -> str | None:
    """What keeps `source` from being a whole torch.save archive, in one line, or None."""
    try:
        if hasattr(source, "seek"):
            source.seek(start)
            head, whole = source.read(len(HEAD)), zipfile.is_zipfile(source)
        else:
            with open(source, "rb") as f:
                head, whole = f.read(len(HEAD)), zipfile.is_zipfile(f)
    except OSError as error:
        return f"it cannot be read ({error.strerror or error})"
    if not head:
        return "the file is empty"
    if head != HEAD:
        return "not a stalebench checkpoint (not a torch.save archive)"
    if not whole:
        return "the file is truncated or corrupt (not a whole torch.save archive)"
    return None


class _Inert:
    """Whatever a global named in the pickle would have built: takes any arguments, state
    and items, and keeps none of them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, item: Any) -> None:
        pass

    def extend(self, items: Any) -> None:
        pass


class _Reader(pickle.Unpickler):
    def __init__(self, file: IO[bytes]):
        super().__init__(file)
        self.stored = {f"{c.__module__}.{c.__qualname__}" for c in STORED}

    def find_class(self, module: str, name: str) -> type:  # never imports or resolves
        named = f"{module}.{name}"
        stdlib = module.split(".")[0] in sys.stdlib_module_names
        if stdlib and named not in STDLIB_DATA and named not in self.stored:
            raise Unreadable(
                f"not loaded: it names {named}, which is not data a checkpoint may "
                "hold (tensors, plain data, and the classes marked with stalebench.registry.stored)"
            )
        return _Inert

    def persistent_load(self, pid: Any) -> None:  # a tensor's storage, kept apart
        return None


def peek(path: Path) -> Any:
    """The object state.pt holds, its tensors and classes inert (see the module's text);
    raises `Unreadable`, naming the file, for one that is not a whole torch.save archive
    or names a callable of the standard library no checkpoint holds."""
    fault = container_fault(path)
    if fault:
        raise Unreadable(f"{path}: not loaded: {fault}")
    try:
        with zipfile.ZipFile(path) as zf:
            pickles = [n for n in zf.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if len(pickles) != 1:
                raise Unreadable(f"{path}: not loaded: not a stalebench checkpoint (no data.pkl)")
            data = zf.read(pickles[0])
        return _Reader(io.BytesIO(data)).load()
    except Unreadable as exc:
        if str(exc).startswith(str(path)):
            raise
        raise Unreadable(f"{path}: {exc}") from None
    except (zipfile.BadZipFile, pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
        raise Unreadable(
            f"{path}: not loaded: the file is truncated or corrupt ({type(exc).__name__})"
        ) from None


def check(state: Path, sha: str) -> None:
    """Refuse (`Unreadable`) a state.pt that is not a stalebench checkpoint of the config
    `sha`, without torch: `checkpoint.load` and the CLI's early check both ask."""
    saved = peek(state)
    if not isinstance(saved, dict) or "config_sha" not in saved:
        what = type(saved).__name__ if not isinstance(saved, _Inert) else "object"
        raise Unreadable(f"{state}: not a stalebench checkpoint (it holds a {what}, no config_sha)")
    if saved["config_sha"] != sha:
        raise Unreadable(
            f"{state}: from another config: its config_sha is {saved['config_sha']}, its "
            f"config.json's {sha}"
        )


def config_of(run_dir: Path) -> str | None:
    """The config sha `config.json` names (None: no checkpoint, or one that names none)."""
    try:
        return json.loads((Path(run_dir) / DIR / CONFIG).read_text()).get("config_sha")
    except (OSError, ValueError, AttributeError):
        return None


def refuse_early(run_dir: Path, sha: str) -> None:
    """resume=true: refuse (`BadCheckpoint`) a checkpoint of the config `sha` that `check`
    refuses, before torch is imported or the dataset read; a run that completed with this
    config is kept whatever its checkpoint holds (`experiment.claim_run_dir`)."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        summary = None
    if isinstance(summary, dict) and summary.get("status") == "completed":
        if summary.get("config_sha") == sha:
            return
    state = Path(run_dir) / DIR / "state.pt"
    if state.exists() and config_of(run_dir) == sha:
        try:
            check(state, sha)
        except Unreadable as exc:
            raise BadCheckpoint(str(exc)) from None
