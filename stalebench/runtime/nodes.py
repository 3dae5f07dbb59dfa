"""Ranks started by torchrun, on one node or several: which process plays rank 0 (the
server, or stage 0, which owns the run directory), whatever rank the rendezvous gave it.
The tasks of a SLURM job (Hydra's submitit launcher with several tasks, `from_submitit`)
join as torchrun's processes do, their ranks from SLURM's environment.

The node that owns the run directory is started with `STALEBENCH_RUN_DIR_NODE=1`, the
others with `=0`; then its first process (`LOCAL_RANK` 0) is rank 0 and its other
processes come next, whatever order the rendezvous picked. With the variable set nowhere,
torchrun's rank 0 is rank 0. The processes agree on their ranks through torchrun's store,
then form the process group in that order.

Rank 0 beats in the store (`beat`): a rank that lost it tells a dead rank 0 (its node
lost; the summary is then the survivors' to write) from a live one still writing its own
(`rank_0_alive`), and names the ranks that shared its node (`same_node`).

Every process checks the input itself (its node's files and devices may differ), then
waits for the others' checks (`agree`): a refusal on any of them is posted to the store
(`tell_refusal`) and every other process ends with the same line, none before every
process has said it (`ending_on_refusal`). Each job of a sweep
(`-m`) meets under its own prefix of the store (`JOB`), and forms its own process group.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from stalebench.errors import ConfigError, RunError

if TYPE_CHECKING:
    import torch.distributed as dist

OWNER_ENV = "STALEBENCH_RUN_DIR_NODE"
FORMING = timedelta(minutes=5)  # the longest wait for the other processes to arrive
REFUSED = "refused"  # the store's key for the first refusal of the input, on any process
HEARD = "heard/"  # + rank: that process said the refusal's line (`ending_on_refusal`)
HEARD_S = 10.0  # the longest a process that said it waits for the others to have said it
JOB = "0"  # this process's job of a sweep (its number under -m): the store's prefix for it
POLL_S = 0.1
BEAT_S = 0.5  # rank 0's beat in the store
_main: dist.Store | None = None  # this process's connection to the store (`store`)
NODE_OF: list[str] = []  # each rank's node (GROUP_RANK), once the group formed
_beating = threading.Event()  # set: the beat of an earlier job of a sweep stops


def under_torchrun() -> bool:
    return "RANK" in os.environ


def in_submitit() -> bool:
    """Is this a task of a submitit job (SLURM's, or its local executor's)?"""
    return "SUBMITIT_EXECUTOR" in os.environ


REQUEUED = ".requeued"  # in a run directory: its submitit job was requeued (resume it)


def from_submitit() -> bool:
    """In a task of a submitit job of several tasks (SLURM's, or submitit's local
    executor's): the environment torch's env:// initialisation reads, from submitit's own
    helper (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR: the job's first host, MASTER_PORT:
    drawn from the job's id), and its node (GROUP_RANK), so that the job's tasks form one
    run as torchrun's processes do. Whether they do."""
    if under_torchrun() or not in_submitit():
        return False
    import submitit

    job = submitit.JobEnvironment()
    if job.num_tasks < 2:
        return False
    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    os.environ["GROUP_RANK"] = str(job.node)
    return True


def owns_run_dir() -> bool:
    """Does this process play rank 0? (A process that is not under torchrun does.)"""
    if not under_torchrun():
        return True
    flag = os.environ.get(OWNER_ENV)
    if flag is None:
        return os.environ["RANK"] == "0"
    return flag == "1" and os.environ.get("LOCAL_RANK", "0") == "0"


def _connect(timeout: timedelta, master: bool = False) -> dist.Store:
    import torch.distributed as dist

    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         is_master=master, timeout=timeout)  # fmt: skip


def _prefixed(main: dist.Store) -> dist.Store:
    import torch.distributed as dist

    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)
    return dist.PrefixStore(f"stalebench/{restart}/{JOB}/", main)


def check_size(needed: int, who: str) -> None:
    """The launch's processes are the run's: torchrun's, or a SLURM job's tasks."""
    world = int(os.environ["WORLD_SIZE"])
    if world != needed:
        how = "torchrun's nproc_per_node × nnodes"
        if in_submitit():
            how = "hydra.launcher.tasks_per_node × hydra.launcher.nodes"
        raise ConfigError(
            f"the launch starts {world} processes, but {who} runs {needed}: set {how} to {needed}"
        )


def store(timeout: timedelta) -> dist.Store:
    """torchrun's store (its agent's), under our prefix; a restart gets a fresh one. Under
    another launcher that sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (env://),
    rank 0 hosts it, as torch's env:// rendezvous does. One connection a process (rank 0
    may host it), each job of a sweep under its own prefix."""
    global _main
    if _main is None:
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        _main = _connect(timeout, master=not agent and os.environ["RANK"] == "0")
    _main.set_timeout(timeout)
    return _prefixed(_main)


def beat(timeout: timedelta) -> None:
    """Rank 0: raise a counter in the store every BEAT_S, from a thread and a connection
    of its own, while it lives (`rank_0_alive`); an earlier job's beat (-m) stops."""
    global _beating
    _beating.set()
    shared, stop = _prefixed(_connect(timeout)), threading.Event()
    _beating = stop

    def run() -> None:
        with contextlib.suppress(Exception):  # the store gone: nobody to tell
            while not stop.is_set():
                shared.add("beat", 1)
                stop.wait(BEAT_S)

    threading.Thread(target=run, name="stalebench-beat", daemon=True).start()


def rank_0_alive(shared: dist.Store) -> bool:
    """Does rank 0 still beat (`beat`)? Its counter moves within 4 beats; not where the
    store is gone."""
    try:
        first = shared.add("beat", 0)
        deadline = time.monotonic() + 4 * BEAT_S
        while time.monotonic() < deadline:
            time.sleep(BEAT_S / 2)
            if shared.add("beat", 0) != first:
                return True
    except Exception:  # the store's node is gone: rank 0's, or its agent with it
        pass
    return False


def log_dir(run_dir: Path, rank: int) -> Path:
    """Where `rank` logs: the run directory's `logs/` on rank 0's node; on another node,
    which may not share that disk, a directory of this node's own, named after it and the
    run, in its temporary directory (rank 0 gathers these logs into the run directory at
    the end: `gathered_log`)."""
    if not NODE_OF or NODE_OF[rank] == NODE_OF[0]:
        return run_dir / "logs"
    return own_log_dir(run_dir)


def own_log_dir(run_dir: Path) -> Path:
    """This node's own directory for the logs of its ranks in the run at `run_dir` (the
    ranks on rank 0's node log into `<run_dir>/logs` instead: `log_dir`)."""
    name = "-".join(p for p in run_dir.parts if p != run_dir.anchor)
    return Path(tempfile.gettempdir()) / "stalebench-logs" / socket.gethostname() / name


LOG_KEEP = 1 << 20  # the last bytes of a rank's log gathered into the run directory


def send_log(shared: dist.Store, path: Path, rank: int) -> None:
    """A rank off rank 0's node, at its end: its log's last LOG_KEEP bytes to the store."""
    with contextlib.suppress(Exception):  # no log, or no store: nothing gathered
        with open(path, "rb") as f:
            f.seek(max(path.stat().st_size - LOG_KEEP, 0))
            shared.set(f"log/{rank}", f.read())


def gathered_log(shared: dist.Store, rank: int) -> bytes | None:
    """Rank 0: the log `rank` sent (`send_log`), if it did."""
    with contextlib.suppress(Exception):
        if shared.check([f"log/{rank}"]):
            return shared.get(f"log/{rank}")
    return None


def same_node(rank: int) -> list[int]:
    """The ranks on `rank`'s node (itself among them), as the group formed."""
    return [r for r, node in enumerate(NODE_OF) if node == NODE_OF[rank]]


def tell_refusal(message: str) -> None:
    """This process refused the input, or heard another's refusal, and said its line: the
    others hear it (`wait_all`) and end with the same line. The first refusal stands; a
    store already gone tells nothing (the others find that out themselves)."""
    try:
        store(timedelta(seconds=5)).compare_set(REFUSED, "", message)
    except Exception:  # noqa: S110  (the store's own errors: nothing more to tell)
        pass


def ending_on_refusal() -> None:
    """This process said the refusal's line and is about to end (rank 0: its directory
    removed): it marks that in the store, then waits, at most HEARD_S, until every process
    has. A process that ended at once could cut another's line short: torchrun's agents stop
    a node's processes as soon as a process elsewhere has ended, and rank 0 may host the
    store."""
    try:
        shared = store(timedelta(seconds=5))
        shared.set(f"{HEARD}{os.environ['RANK']}", "1")
        everyone = [f"{HEARD}{r}" for r in range(int(os.environ["WORLD_SIZE"]))]
        deadline = time.monotonic() + HEARD_S
        while not shared.check(everyone) and time.monotonic() < deadline:
            time.sleep(POLL_S)
    except Exception:  # noqa: S110  (the store gone: nobody left to wait for)
        pass


def wait_all(shared: dist.Store, keys: list[str], what: str) -> None:
    """Wait until every key of `keys` is set, at most FORMING; a refusal posted meanwhile
    (`tell_refusal`) is raised here as this process's own (a ConfigError, its message)."""
    deadline = time.monotonic() + FORMING.total_seconds()
    while not shared.check(keys):
        if shared.check([REFUSED]):
            raise ConfigError(shared.get(REFUSED).decode())
        if time.monotonic() > deadline:
            raise RunError(f"torchrun: {what}: not all {len(keys)} processes within {FORMING}")
        time.sleep(POLL_S)
    if shared.check([REFUSED]):  # posted by a process that came last
        raise ConfigError(shared.get(REFUSED).decode())


def agree() -> None:
    """Every process of a torchrun launch, once it checked the input: wait for the others'
    checks (a refusal on any process is raised here, as a ConfigError with its message)."""
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    shared = store(FORMING)
    shared.set(f"checked/{rank}", "1")
    wait_all(shared, [f"checked/{r}" for r in range(world)], "checking the input")


def roles(flags: list[str], nodes: list[str]) -> list[int]:
    """The order of torchrun's ranks as the run's ranks: the processes of the node flagged
    "1" first, then the others, each in torchrun's order. `flags[r]`, `nodes[r]`: the flag
    and the node (GROUP_RANK) of torchrun's rank r."""
    owners = {n for f, n in zip(flags, nodes, strict=True) if f == "1"}
    if len(owners) > 1:
        raise RunError(f"{OWNER_ENV}=1 on {len(owners)} nodes: set it on one (=0 elsewhere)")
    if not owners and "0" in flags:
        raise RunError(f"{OWNER_ENV}=0 on some node but =1 on none: set it on the run dir's node")
    return sorted(range(len(flags)), key=lambda r: (flags[r] != "1", r))


def form_group(timeout: timedelta) -> tuple[int, dist.Store]:
    """Join the process group of a torchrun launch as the rank this process plays; returns
    it, and the store (where rank 0 says that summary.json is written)."""
    import torch.distributed as dist

    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    # every process waits here for the others, rank 0 last (it checks the input first)
    shared = store(max(timeout, FORMING))
    node = os.environ.get("GROUP_RANK", "0")
    shared.set(f"node/{rank}", f"{os.environ.get(OWNER_ENV, '')}:{node}")
    wait_all(shared, [f"node/{r}" for r in range(world)], "forming the process group")
    seen = [shared.get(f"node/{r}").decode().split(":") for r in range(world)]
    order = roles([f for f, _ in seen], [n for _, n in seen])
    role = order.index(rank)
    NODE_OF[:] = [seen[r][1] for r in order]  # the node of each rank it plays
    group = dist.PrefixStore("group/", shared)
    if dist.is_initialized():  # an earlier job's of this sweep (-m), maybe never torn down
        dist.destroy_process_group()
    dist.init_process_group("gloo", store=group, rank=role, world_size=world, timeout=timeout)
    return role, shared
