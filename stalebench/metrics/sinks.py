"""Sinks that follow a run's events.jsonl while it is written: a progress line on the
terminal and Weights & Biases. They run in the CLI's process only (never in a server or
worker), read the same file reports read, and can never fail or stall the run: a sink
that raises is switched off with one warning, and events.jsonl stays the source of truth.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any, TextIO

from stalebench.errors import last_line
from stalebench.metrics.events import CLOCKS

log = logging.getLogger("stalebench")


class Sink:
    def on_event(self, event: dict[str, Any]) -> None:
        pass

    def close(self, summary: dict[str, Any] | None) -> None:
        pass


class EventTail(threading.Thread):
    """Hands every complete line appended to `path` to the sinks, every `poll_s` seconds;
    with no sink (none asked, or each switched off) it reads nothing."""

    def __init__(self, path: Path, sinks: list[Sink], poll_s: float = 0.5):
        super().__init__(daemon=True, name="event-tail")
        self.path, self.sinks, self.poll_s = Path(path), list(sinks), poll_s
        self._stop_event = threading.Event()
        self._offset, self._partial = 0, b""

    def run(self) -> None:
        while not self._stop_event.wait(self.poll_s):
            self._drain()

    def _drain(self) -> None:
        if not self.sinks or not self.path.exists():
            return
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()  # an incomplete last line waits for the next read
        for line in lines:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            for sink in list(self.sinks):
                self._call(sink, sink.on_event, event)

    def close(self, summary: dict[str, Any] | None) -> None:
        """Stop following, read what is left, and close every sink."""
        self._stop_event.set()
        if self.is_alive():
            self.join()
        self._drain()
        for sink in list(self.sinks):
            self._call(sink, sink.close, summary)

    def _call(self, sink: Sink, method, arg) -> None:
        try:
            method(arg)
        except Exception as exc:  # a sink must never take the run down
            log.warning("%s switched off: %s", type(sink).__name__, exc)
            print(
                f"stalebench: warning: {type(sink).__name__} switched off: {exc}", file=sys.stderr
            )
            self.sinks.remove(sink)


class Progress(Sink):
    """One live line: updates and updates/s, recent training loss, mean lag, elapsed and
    remaining budget. Silent when the stream is not a terminal."""

    def __init__(
        self,
        label: str,
        max_updates: int,
        max_wall_s: float,
        stream: TextIO | None = None,
        every_s: float = 0.5,
    ):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.label, self.max_updates, self.max_wall_s = label, max_updates, max_wall_s
        self.every_s, self._shown = every_s, -math.inf  # run time of the line last drawn
        self.updates, self.t, self.loss, self.lag_sum, self.count = 0, 0.0, None, 0, 0
        self._width = 0  # of the line drawn last: a shorter one is padded over it

    def say(self, what: str) -> None:
        """A line before the first update (`[ssp] preparing data and model …`): the
        seconds of imports, data and process start are not a blank terminal."""
        if self.enabled:
            self._draw(f"[{self.label}] {what}")

    def _draw(self, text: str) -> None:
        self.stream.write("\r" + text + " " * max(self._width - len(text), 0))
        self.stream.flush()
        self._width = len(text)

    def on_event(self, event: dict[str, Any]) -> None:
        if self.enabled and event.get("event") == "start" and self.count == 0:
            self.say("started; waiting for the first update …")
        if not self.enabled or event["kind"] != "update":
            return
        self.updates, self.t = event["version"], event["t"]
        if event.get("loss") is not None:
            self.loss = (
                event["loss"] if self.loss is None else 0.9 * self.loss + 0.1 * event["loss"]
            )
        self.lag_sum, self.count = self.lag_sum + event["lag"], self.count + 1
        if self.t - self._shown >= self.every_s:
            self._shown = self.t
            self._draw(self.line())

    def line(self) -> str:
        rate = self.updates / self.t if self.t > 0 else 0.0
        budget = []
        if self.max_updates:
            budget.append(f"{self.updates}/{self.max_updates} updates")
        if self.max_wall_s:
            budget.append(f"{max(self.max_wall_s - self.t, 0.0):.1f} s left")
        loss = "—" if self.loss is None else f"{self.loss:.3f}"
        return (
            f"[{self.label}] {self.updates} updates ({rate:.0f}/s) loss {loss} "
            f"lag {self.lag_sum / max(self.count, 1):.1f} t {self.t:.1f} s | " + ", ".join(budget)
        )

    def close(self, summary: dict[str, Any] | None) -> None:
        if self.enabled and self._width:
            self.stream.write("\n")
            self.stream.flush()


class Wandb(Sink):
    """One W&B run per stalebench run, offline unless configured: the resolved config, the
    sweep as `group`, the algorithm as `job_type`, the run's time as the x-axis under a key
    that names its clock (`time/simulated_s` for runtime=sim, `time/real_s` for
    runtime=real: `time_key`), training curves while the run goes, evaluations when they
    are written, and at the end a lag histogram, per-worker compute/wait/comm, and the
    summary (its `clock` and `run_time_s` among it)."""

    WINDOW_S = 0.5  # update events are averaged over this much run time per logged point

    def __init__(
        self,
        *,
        project: str,
        mode: str,
        run_dir: Path,
        name: str,
        group: str | None,
        job_type: str,
        config: dict[str, Any],
    ):
        import wandb

        self.wandb = wandb
        self.time = time_key(config.get("runtime"))
        self.fallback: str | None = None  # why an online start failed (then: offline)

        def start(mode: str):
            return wandb.init(
                project=project,
                mode=mode,
                dir=str(run_dir),
                name=name,
                group=group,
                job_type=job_type,
                config=config,
                reinit="finish_previous",
                settings=wandb.Settings(silent=True, init_timeout=60),
            )

        try:
            self.run = start(mode)
        except Exception as exc:  # online: no API key, the host down; offline then
            if mode != "online":
                raise
            self.fallback = last_line(exc)
            self.run = start("offline")
        self.run.define_metric(self.time)
        self.run.define_metric("*", step_metric=self.time)
        self.lags: list[int] = []
        self.per_worker: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        self.window: list[dict[str, Any]] = []

    def on_event(self, event: dict[str, Any]) -> None:
        kind = event["kind"]
        if kind == "update":
            self.lags.append(event["lag"])
            totals = self.per_worker[event["worker"]]
            for i, key in enumerate(("compute_s", "wait_s", "comm_s")):
                totals[i] += event[key]
            self.window.append(event)
            if event["t"] - self.window[0]["t"] >= self.WINDOW_S:
                self._log_window()
        elif kind == "eval":
            self._log_window()
            split = event["split"]
            self.run.log(
                {
                    self.time: event["t"],
                    f"{split}/loss": event["loss"],
                    f"{split}/accuracy": event["accuracy"],
                    "sys/version": event["version"],
                }
            )

    def _log_window(self) -> None:
        if not self.window:
            return
        w, self.window = self.window, []
        losses = [e["loss"] for e in w if e.get("loss") is not None]
        self.run.log(
            {
                self.time: w[-1]["t"],
                "train/batch_loss": sum(losses) / len(losses) if losses else None,
                "sys/lag": sum(e["lag"] for e in w) / len(w),
                "sys/updates": w[-1]["version"],
            }
        )

    def close(self, summary: dict[str, Any] | None) -> None:
        try:
            self._log_window()
            if self.lags:
                self.run.log({"lag/histogram": self.wandb.Histogram(self.lags)})
            table = self.wandb.Table(
                columns=["worker", "compute_s", "wait_s", "comm_s"],
                data=[[w, *v] for w, v in sorted(self.per_worker.items())],
            )
            self.run.log({"workers/time": table})
            if summary:
                self.run.summary.update({k: v for k, v in summary.items() if k != "host"})
        finally:
            self.run.finish()  # always: multirun jobs must never merge into one W&B run


def time_key(runtime) -> str:
    """The W&B x-axis of a run in `runtime`: its time in seconds on the run's clock, the key
    naming the clock (`time/simulated_s`, `time/real_s`), so that a chart never lays
    simulated seconds over real ones unsaid; `time/s` for a runtime it does not know."""
    clock = CLOCKS.get(runtime) if isinstance(runtime, str) else None
    return f"time/{clock}_s" if clock else "time/s"


def log_verdicts(
    verdicts: list[dict[str, Any]], *, project: str, mode: str, group: str, out_dir: Path
) -> None:
    """A paper sweep's claim verdicts as one W&B run in the paper's group (job_type claims):
    a table of every claim and the count of each verdict in the summary."""
    import wandb

    columns = ["id", "scope", "text", "metric", "published", "ours", "verdict", "notes"]
    run = wandb.init(
        project=project,
        mode=mode,
        dir=str(out_dir),
        name=f"claims-{out_dir.name}",
        group=group,
        job_type="claims",
        reinit="finish_previous",
        settings=wandb.Settings(silent=True, init_timeout=60),
    )
    try:
        table = wandb.Table(
            columns=columns, data=[[str(v.get(c, "")) for c in columns] for v in verdicts]
        )
        run.log({"claims": table})
        for v in verdicts:
            run.summary[f"verdict/{v['id']}" + (f"[{v['scope']}]" if v["scope"] else "")] = v[
                "verdict"
            ]
    finally:
        run.finish()
