"""Cluster profiles, one schema for both runtimes: how many workers, how long each one's
steps take (a compute-time model × a per-worker speed multiplier × transient stragglers),
how slow the network is per message and direction (priced by the runtime's network model,
`stalebench.runtime.network`), scheduled faults, and how a run survives a lost worker
(`spares` standing by to take its place, `min_replicas` to go on without it).

Every draw comes from a stream of the worker's own, seeded by (seed, worker): step k of
worker w takes the same time in the real and the sim runtime, and one seed gives one
straggler pattern. The real runtime measures its real compute and sleeps up to the drawn
time (a profile can slow compute, never speed it up); the sim runtime advances its virtual
clock by the drawn time.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from stalebench.errors import ConfigError
from stalebench.registry import ComponentConfig, Registry, stored

COMPUTE_MODELS = ("constant", "gamma", "lognormal", "trace")
WAKE_FORMS = ("sqrt", "queued", "busy")  # `cluster.wake_form`: runtime.compute.Host.wake


# named devices whose peak FLOP rate times a step from the run's model (`cluster.device`;
# the arithmetic: stalebench.runtime.compute). The peaks are the vendors' dense datasheet
# figures, estimates of a step until measured (`stalebench calibrate`)
@dataclasses.dataclass(frozen=True)
class Device:
    name: str
    tflops: dict[str, float]  # precision -> dense peak, TFLOP/s
    source: str
    gpu: bool = True  # a GPU (a transport that stages through host memory copies its bytes)


DEVICES = {
    d.name: d
    for d in (
        Device(
            "p4000",
            {"fp32": 5.3},
            "NVIDIA Quadro P4000 datasheet: FP32 5.3 TFLOPS (no tensor cores)",
        ),
        Device(
            "v100",
            {"fp32": 15.7, "fp16": 125.0},
            "NVIDIA Tesla V100 datasheet (SXM2): FP32 15.7, Tensor (FP16) 125 TFLOPS",
        ),
        Device(
            "a100",
            {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
            "NVIDIA A100 datasheet (SXM4): FP32 19.5, TF32 156, BF16/FP16 312 TFLOPS dense",
        ),
        Device(
            "h100",
            {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
            "NVIDIA H100 datasheet (SXM5): FP32 67, TF32 495, BF16/FP16 989 TFLOPS dense "
            "(the sheet's 989/1979 are with sparsity)",
        ),
        # CPU nodes: cores × base clock × 32 fp32 FLOP a cycle (Haswell's AVX2, two 8-wide
        # FMA units a core); the all-core AVX clock is lower, so these are upper bounds
        Device(
            "xeon_e5_2697v3",
            {"fp32": 2.3296},
            "a node of two Intel Xeon E5-2697 v3 (Haswell-EP; Intel ARK: 14 cores, 2.6 GHz "
            "base): 2 × 14 × 2.6 GHz × 32 FLOP a cycle = 2.33 TFLOP/s FP32",
            gpu=False,
        ),
        Device(
            "c4_8xlarge",
            {"fp32": 1.6704},
            "an AWS EC2 c4.8xlarge (36 vCPUs: 18 cores of Intel Xeon E5-2666 v3, Haswell, "
            "2.9 GHz base): 18 × 2.9 GHz × 32 FLOP a cycle = 1.67 TFLOP/s FP32",
            gpu=False,
        ),
    )
}


def check_device(device: str, precision: str, utilization: float) -> None:
    """The device keys of a cluster profile, by name."""
    if not device:
        return
    if device not in DEVICES:
        raise ConfigError(f"cluster.device: unknown {device!r}; known: {', '.join(DEVICES)}")
    if precision not in DEVICES[device].tflops:
        known = ", ".join(DEVICES[device].tflops)
        raise ConfigError(f"cluster.precision={precision!r}: {device} has {known}")
    if not 0 < utilization <= 1:
        raise ConfigError(f"cluster.utilization must be in (0, 1], got {utilization!r}")


FAULT_ACTIONS = ("pause", "die", "slow", "slow_compute")
# actions the profile's step times carry (`Profile.step_s`), not the runtime's fault
# wrappers (`stalebench.runtime.faults.Faults` leaves them out)
STEP_ACTIONS = ("slow_compute",)


@stored
@dataclasses.dataclass
class FaultConfig:
    worker: int = 0
    at_s: float = 0.0  # run time (s, real or virtual) after which the fault strikes
    # pause: the worker goes silent for duration_s; die: it exits; slow: every message it
    # sends takes delay_ms longer, for duration_s (0 = to the end of the run);
    # slow_compute: its steps take `factor` times the profile's step time from its step
    # at_step on, for duration_steps steps (0 = to the end of the run)
    action: str = "pause"
    duration_s: float = 0.0  # pause length, or how long sends are slowed (s)
    # or, when >= 0, the worker's step (0-based) at whose start it strikes, whatever the time
    at_step: int = -1
    delay_ms: float = 0.0  # slow: the extra time of each message the worker sends
    factor: float = 1.0  # slow_compute: the step time's multiplier (> 1)
    duration_steps: int = 0  # slow_compute: how many steps it lasts (0 = to the end)


@dataclasses.dataclass
class ClusterConfig(ComponentConfig):
    preset: str = "custom"  # the profile's name in reports (set by conf/cluster presets)
    num_workers: int = 4
    # compute time of one step on a speed-1 worker: constant, gamma, lognormal or trace
    compute: str = "constant"
    compute_ms: float = 0.0  # its mean (ms); 0 = real compute only (real runtime)
    # or the mean from the run's model: its FLOPs per step on this device (p4000, v100, a100,
    # h100; CPU nodes xeon_e5_2697v3, c4_8xlarge)
    # at `precision`, at `utilization` of the dense peak (stalebench.runtime.compute); set
    # before any process starts, into compute_ms
    device: str = ""
    precision: str = "fp32"
    utilization: float = 0.4
    # or a measured curve: a CSV with columns batch,relative (a device's throughput at a
    # minibatch over its best, `benchmarks/utilisation.py` measures one), by which a step
    # of the run's minibatch is slower (linear in log2 of the batch, flat past its ends)
    utilization_curve: str = ""
    gamma_shape: float = 100.0  # k of Gamma(k, compute_ms / k): coefficient of variation 1/√k
    lognormal_sigma: float = 0.5  # σ of the log; the mean stays compute_ms
    trace_file: str = ""  # CSV with columns worker,ms: each worker's step times, replayed
    # per-worker speed multipliers (≥ 1 = slower); empty = from slow_fraction and slow_factor
    slowdown: list[float] = dataclasses.field(default_factory=list)
    slow_fraction: float = 0.0  # fraction of workers (the last ones) that are slow
    slow_factor: float = 1.0  # how many times slower the first slow worker is
    slow_factor_max: float = 0.0  # the last slow one (spread linearly); 0 = slow_factor
    straggler_prob: float = 0.0  # chance that one step is a transient straggler
    straggler_factor: float = 5.0  # how many times longer a straggling step takes
    # network, per message: latency + bytes / bandwidth (bandwidth 0 = unlimited)
    push_latency_ms: float = 0.0  # worker -> server
    pull_latency_ms: float = 0.0  # server -> worker
    push_bandwidth_gbps: float = 0.0
    pull_bandwidth_gbps: float = 0.0
    # topology (stalebench.runtime.network.Topology): rank r sits on host r; hosts fill
    # racks of `rack_size` in rank order, racks fill regions of `region_size`. A message
    # between racks also crosses its sender's rack uplink and its receiver's rack downlink
    # (shared by every host of the rack: an oversubscribed uplink is one slower than the
    # sum of its hosts' NICs) and pays `rack_latency_ms`; between regions it also crosses
    # the WAN link of the region pair (`wan_bandwidth_gbps[a][b]`, `wan_latency_ms[a][b]`)
    rack_size: int = 0  # hosts per rack; 0 = one switch, no racks
    rack_bandwidth_gbps: float = 0.0  # each rack's uplink, each direction (0 = unlimited)
    rack_latency_ms: float = 0.0  # what crossing from one rack to another adds
    region_size: int = 0  # racks per region; 0 = one region
    wan_bandwidth_gbps: list[Any] = dataclasses.field(default_factory=list)  # G × G
    wan_latency_ms: list[Any] = dataclasses.field(default_factory=list)  # G × G or empty
    # what moves the bytes (stalebench.transports, each preset with its source): the share
    # of line rate the NICs' bytes reach, a fixed cost per collective and per message,
    # whether messages on a connection overlap their latencies, the all-reduce algorithm,
    # a staging copy through host memory (priced where the device is a GPU); "ideal": line
    # rate, a ring, nothing fixed. Each of the five keys below overrides the preset's value
    transport: str = "ideal"
    collective: str = ""  # ring, recursive_doubling, tree, hierarchical, sharded_ps; "": its
    efficiency: float = 0.0  # 0: the transport's (which it must have)
    collective_ms: float = -1.0  # -1: the transport's
    message_ms: float = -1.0  # -1: the transport's
    pipelined: bool | None = None  # None: the transport's
    # hosts of several GPUs: ranks fill hosts of `gpus_per_host` in rank order and share its
    # NIC (push_*/pull_* are the host's); between GPUs of a host, `host_link` (nvlink2,
    # pcie3) or `host_link_gbps` each way; a staging copy crosses `staging_link`
    gpus_per_host: int = 1
    host_link: str = ""
    host_link_gbps: float = 0.0  # 0: the named link's
    staging_link: str = "pcie3"
    ps_placement: str = "mxnet"  # collective=sharded_ps: which server holds each key
    # the host: what processes on one machine pay beyond the profile's steps and messages,
    # priced by the simulator (real processes pay it for real; `stalebench calibrate`
    # measures it; all 0 = an ideal host, the default)
    host_cores: int = 0  # the cores the run's ranks share (0: a core per rank, no sharing)
    overhead_ms: float = 0.0  # a rank's CPU per step beyond the step (its loop around it)
    # a rank's time per step beyond the step and overhead_ms that takes no core (handing a
    # message to its threads and back), not shared; `stalebench calibrate` leaves it 0
    stall_ms: float = 0.0
    hub_ms: float = 0.0  # a hub's CPU per message it takes (the server's apply, bookkeeping)
    # while the run's ranks outnumber host_cores: what a rank that blocked on a message (a
    # reply, a collective's end) waits for a core once it is in (the scheduler's latency),
    # with one rank beyond the cores
    wake_ms: float = 0.0
    # how the wait grows with the ranks beyond the cores: as the square root of the run's
    # ranks past host_cores (`sqrt`, the default), in proportion to them (`queued`), or to
    # the ranks busy (computing, handling) then, the woken one included, past them (`busy`:
    # a core left idle takes it at once); all give wake_ms with one rank beyond the cores
    wake_form: str = "sqrt"
    faults: list[FaultConfig] = dataclasses.field(default_factory=list)
    # standby workers: each lost worker's place is taken by the next (its shard, speed,
    # clock and later faults; it reads the current θ), while any is left (engine=ps, under
    # a barrier that never waits)
    spares: int = 0
    # serverless engines (allreduce): the fewest replicas a round may go on with once some
    # are lost (dead, or silent past timeout_s): the survivors agree on who is left and
    # average over themselves; 0 = all of them (a lost replica fails the run)
    min_replicas: int = 0

    def __post_init__(self) -> None:
        def bad(key: str, value: object, valid: str) -> ConfigError:
            return ConfigError(f"cluster.{key} must be {valid}, got {value!r}")

        if not isinstance(self.faults, (list, tuple)):  # an interpolation's value
            raise bad("faults", self.faults, "a list of faults")
        self.faults = [_fault(f, i) for i, f in enumerate(self.faults)]
        if self.num_workers < 1:
            raise bad("num_workers", self.num_workers, ">= 1")
        if self.spares < 0:
            raise bad("spares", self.spares, ">= 0")
        if not 0 <= self.min_replicas <= self.num_workers:
            raise bad("min_replicas", self.min_replicas, f"in [0, num_workers={self.num_workers}]")
        check_device(self.device, self.precision, self.utilization)
        if self.utilization_curve and not self.device:
            raise bad(
                "utilization_curve", self.utilization_curve, "'' unless cluster.device is set"
            )
        _check_topology(self, bad)
        _check_transport(self, bad)
        if self.compute not in COMPUTE_MODELS:
            raise bad("compute", self.compute, f"one of {', '.join(COMPUTE_MODELS)}")
        if self.host_cores < 0:
            raise bad("host_cores", self.host_cores, ">= 0 (0: a core per rank)")
        if self.wake_form not in WAKE_FORMS:
            raise bad("wake_form", self.wake_form, f"one of {', '.join(WAKE_FORMS)}")
        for key in (
            "compute_ms",
            "overhead_ms",
            "stall_ms",
            "hub_ms",
            "wake_ms",
            "push_latency_ms",
            "pull_latency_ms",
            "push_bandwidth_gbps",
            "pull_bandwidth_gbps",
        ):
            if getattr(self, key) < 0:
                raise bad(key, getattr(self, key), ">= 0")
        if self.compute in ("gamma", "lognormal") and self.compute_ms <= 0:
            raise bad("compute_ms", self.compute_ms, f"> 0 for compute={self.compute}")
        if self.gamma_shape <= 0:
            raise bad("gamma_shape", self.gamma_shape, "> 0")
        if self.lognormal_sigma < 0:
            raise bad("lognormal_sigma", self.lognormal_sigma, ">= 0")
        if self.compute == "trace" and not self.trace_file:
            raise bad("trace_file", self.trace_file, "a CSV path for compute=trace")
        if self.slowdown and len(self.slowdown) != self.num_workers:
            raise bad(
                "slowdown",
                list(self.slowdown),
                f"one multiplier per worker (cluster.num_workers={self.num_workers})",
            )
        if any(m < 1.0 for m in self.slowdown):
            raise bad("slowdown", list(self.slowdown), "multipliers >= 1")
        if not 0.0 <= self.slow_fraction <= 1.0:
            raise bad("slow_fraction", self.slow_fraction, "in [0, 1]")
        if self.slow_factor < 1.0:
            raise bad("slow_factor", self.slow_factor, ">= 1")
        if self.slow_factor_max and self.slow_factor_max < self.slow_factor:
            raise bad("slow_factor_max", self.slow_factor_max, ">= cluster.slow_factor (or 0)")
        if not 0.0 <= self.straggler_prob <= 1.0:
            raise bad("straggler_prob", self.straggler_prob, "in [0, 1]")
        if self.straggler_factor < 1.0:
            raise bad("straggler_factor", self.straggler_factor, ">= 1")
        for i, f in enumerate(self.faults):
            if not 0 <= f.worker < self.num_workers:
                raise bad(f"faults[{i}].worker", f.worker, f"in [0, {self.num_workers})")
            if f.action not in FAULT_ACTIONS:
                raise bad(f"faults[{i}].action", f.action, f"one of {', '.join(FAULT_ACTIONS)}")
            if f.at_s < 0 or f.duration_s < 0:
                raise bad(f"faults[{i}]", f, "at_s >= 0 and duration_s >= 0")
            if (f.action == "slow") != (f.delay_ms > 0):
                raise bad(f"faults[{i}].delay_ms", f.delay_ms, "> 0 with action slow, else 0")
            if f.at_step < -1 or (f.at_step >= 0 and f.at_s):
                raise bad(f"faults[{i}]", f, "at_step >= 0 (with at_s 0) or at_step -1 (by time)")
            if f.action == "slow_compute":
                _check_slow_compute(f, i, bad)
            elif f.factor != 1.0 or f.duration_steps:
                raise bad(
                    f"faults[{i}]",
                    f,
                    "factor 1 and duration_steps 0 unless action is slow_compute",
                )


def _check_topology(c: ClusterConfig, bad) -> None:
    """The topology's keys, by themselves (how many regions the ranks fill is checked once
    the engine says how many ranks there are: `check_regions`)."""
    if c.rack_size < 0:
        raise bad("rack_size", c.rack_size, ">= 0 (0: one switch)")
    if c.region_size < 0 or (c.region_size and not c.rack_size):
        raise bad("region_size", c.region_size, ">= 0, and 0 unless cluster.rack_size > 0")
    for key in ("rack_bandwidth_gbps", "rack_latency_ms"):
        if getattr(c, key) < 0:
            raise bad(key, getattr(c, key), ">= 0")
    for key in ("wan_bandwidth_gbps", "wan_latency_ms"):
        square = "a square matrix (region a's row, region b's column) of numbers >= 0"
        try:
            m = [[float(v) for v in row] for row in getattr(c, key)]
        except (TypeError, ValueError):
            raise bad(key, getattr(c, key), square) from None
        if any(len(row) != len(m) for row in m) or any(not v >= 0 for row in m for v in row):
            raise bad(key, m, square)
        if m and not c.region_size:
            raise bad(key, m, "empty unless cluster.region_size > 0")
        setattr(c, key, m)
    if c.region_size and not c.wan_bandwidth_gbps:
        raise bad("wan_bandwidth_gbps", [], "a G × G matrix with cluster.region_size > 0")
    if c.wan_latency_ms and len(c.wan_latency_ms) != len(c.wan_bandwidth_gbps):
        raise bad("wan_latency_ms", c.wan_latency_ms, "empty or as large as wan_bandwidth_gbps")


def _check_transport(c: ClusterConfig, bad) -> None:
    """The transport's keys: named presets, numbers in range, combinations the network
    model prices (`Network` resolves them)."""
    from stalebench import transports as t

    preset = t.transport(c.transport)
    if c.collective and c.collective not in t.COLLECTIVES:
        raise bad("collective", c.collective, f"one of {', '.join(t.COLLECTIVES)} (or '')")
    if not 0 <= c.efficiency <= 1:
        raise bad("efficiency", c.efficiency, "in (0, 1] (0: the transport's)")
    if preset.efficiency is None and not c.efficiency:
        raise ConfigError(
            f"cluster.efficiency: cluster.transport={c.transport} has no measured share of line "
            "rate (no source pins one): set cluster.efficiency, and say where it comes from"
        )
    for key in ("collective_ms", "message_ms"):
        if getattr(c, key) < 0 and getattr(c, key) != -1:
            raise bad(key, getattr(c, key), ">= 0 (-1: the transport's)")
    if c.gpus_per_host < 1:
        raise bad("gpus_per_host", c.gpus_per_host, ">= 1")
    if c.host_link:
        t.host_link(c.host_link)
    if c.host_link_gbps < 0:
        raise bad("host_link_gbps", c.host_link_gbps, ">= 0 (0: the named link's)")
    if c.gpus_per_host > 1 and not (c.host_link or c.host_link_gbps):
        raise bad("host_link", c.host_link, "a link (nvlink2, pcie3) with gpus_per_host > 1")
    t.host_link(c.staging_link)
    t.placement(c.ps_placement)
    algorithm = c.collective or preset.collective
    if c.rack_size and algorithm != "ring":
        raise bad("collective", algorithm, "ring over racks (cluster.rack_size > 0)")
    if c.rack_size and c.gpus_per_host > 1:
        raise bad("gpus_per_host", c.gpus_per_host, "1 over racks (cluster.rack_size > 0)")
    if algorithm == "sharded_ps" and c.gpus_per_host > 1:
        raise bad("gpus_per_host", c.gpus_per_host, "1 with collective=sharded_ps")


def check_regions(c: ClusterConfig, ranks: int) -> None:
    """The run's `ranks` fill no more regions than the WAN matrices have rows."""
    if not c.region_size:
        return
    racks = math.ceil(ranks / c.rack_size)
    regions = math.ceil(racks / c.region_size)
    if regions > len(c.wan_bandwidth_gbps):
        raise ConfigError(
            f"cluster.wan_bandwidth_gbps has {len(c.wan_bandwidth_gbps)} regions, but the run's "
            f"{ranks} ranks fill {racks} racks of cluster.rack_size={c.rack_size}, {regions} "
            f"regions of cluster.region_size={c.region_size}: give a {regions} × {regions} "
            "matrix, or larger racks or regions"
        )


def _fault(raw: object, i: int) -> FaultConfig:
    """A fault as given: a FaultConfig, or a mapping (what an interpolation such as
    `faults: ${sweep.params.disturbance}` resolves to: OmegaConf leaves it untyped), typed
    and checked here as Hydra checks a fault written out."""
    if isinstance(raw, FaultConfig):
        return raw
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(FaultConfig), raw))
    except (OmegaConfBaseException, ValueError) as exc:
        fields = ", ".join(f.name for f in dataclasses.fields(FaultConfig))
        raise ConfigError(
            f"cluster.faults[{i}] must be a fault ({fields}), got {raw!r}: "
            f"{str(exc).splitlines()[0]}"
        ) from None


def _check_slow_compute(f: FaultConfig, i: int, bad) -> None:
    """A slow_compute fault is part of the worker's step-time stream, which counts steps,
    not seconds: it starts at a step and lasts steps."""
    if f.at_s:
        raise bad(
            f"faults[{i}].at_s",
            f.at_s,
            "0 with action slow_compute (it starts at a step: set at_step)",
        )
    if f.at_step < 0:
        raise bad(f"faults[{i}].at_step", f.at_step, ">= 0 with action slow_compute")
    if f.duration_s:
        raise bad(
            f"faults[{i}].duration_s",
            f.duration_s,
            "0 with action slow_compute (it lasts steps: set duration_steps)",
        )
    if not f.factor > 1.0:
        raise bad(f"faults[{i}].factor", f.factor, "> 1 with action slow_compute")
    if f.duration_steps < 0:
        raise bad(f"faults[{i}].duration_steps", f.duration_steps, ">= 0 (0 = to the end)")


def relative_utilization(path: str, batch: int) -> float:
    """A minibatch of `batch` examples' share of the device's best throughput, from the
    measured curve at `path` (CSV: batch,relative): linear in log2(batch) between the
    measured batches, the nearest one's outside them."""
    rows, where = _csv_rows("utilization_curve", path, ("batch", "relative"))
    try:
        points = sorted((math.log2(int(r["batch"])), float(r["relative"])) for _, r in rows)
    except (TypeError, ValueError):
        raise ConfigError(
            f"cluster.utilization_curve: {where}: batch must be an integer >= 1 and relative "
            "a number in (0, 1]"
        ) from None
    if not points or any(not 0 < r <= 1 for _, r in points):
        raise ConfigError(f"cluster.utilization_curve: {where}: relative must be in (0, 1]")
    xs, ys = zip(*points, strict=True)
    return float(np.interp(math.log2(batch), xs, ys))


def _csv_rows(key: str, path: str, columns: tuple[str, ...]):
    """The rows of the CSV that `cluster.<key>` names, each with its line number, and the
    path as errors name it; refused (by key) where the file or a column is missing."""
    p = Path(path).expanduser()
    where, wanted = repr(str(p)), ",".join(columns)
    if not p.is_file():
        raise ConfigError(f"cluster.{key}: {where} does not exist (CSV: {wanted})")
    with open(p, newline="") as f:
        rows = csv.DictReader(f)
        if not rows.fieldnames or not set(columns) <= set(rows.fieldnames):
            raise ConfigError(f"cluster.{key}: {where} needs the columns {wanted}")
        return list(enumerate(rows, 2)), where


def read_trace(path: str) -> list[np.ndarray]:
    """Per-worker step times (ms) from a CSV with columns worker,ms, in row order."""
    rows, where = _csv_rows("trace_file", path, ("worker", "ms"))
    times: dict[int, list[float]] = {}
    for line, row in rows:
        try:
            times.setdefault(int(row["worker"]), []).append(float(row["ms"]))
        except (TypeError, ValueError):
            raise ConfigError(
                f"cluster.trace_file: {where} line {line}: worker,ms must be an integer "
                f"and a number, got {row['worker']!r},{row['ms']!r}"
            ) from None
    if not times or any(t < 0 for ts in times.values() for t in ts):
        raise ConfigError(f"cluster.trace_file: {where} has no rows or negative times")
    return [np.asarray(times[w]) for w in sorted(times)]


class Profile:
    """Draws each worker's step times (seconds). What the network costs is the runtime's
    network model (`stalebench.runtime.network`), from the same config."""

    def __init__(self, cfg: ClusterConfig, seed: int = 0):
        self.cfg = cfg
        n = cfg.num_workers
        if cfg.slowdown:
            self.slowdown = [float(m) for m in cfg.slowdown]
        else:
            n_slow = math.ceil(cfg.slow_fraction * n)
            top = cfg.slow_factor_max or cfg.slow_factor
            slow = np.linspace(cfg.slow_factor, top, n_slow) if n_slow else []
            self.slowdown = [1.0] * (n - n_slow) + [float(m) for m in slow]
        self.trace = read_trace(cfg.trace_file) if cfg.compute == "trace" else None
        self.streams = [np.random.default_rng([seed, w, 0x5B]) for w in range(n)]
        self.steps = [0] * n  # draws taken per worker (the trace position)
        # each worker's slow_compute faults: (first step, step after the last, factor)
        self.slowed: list[list[tuple[int, float, float]]] = [[] for _ in range(n)]
        for f in cfg.faults:
            if f.action == "slow_compute":
                end = f.at_step + f.duration_steps if f.duration_steps else math.inf
                self.slowed[f.worker].append((f.at_step, end, float(f.factor)))

    def step_s(self, worker: int) -> float:
        """Seconds the next step of `worker` takes (it is padded up to this): its k-th draw
        is its step k (0-based), times the factor of each slow_compute fault in force at k.
        The draws themselves do not depend on the faults."""
        c, rng = self.cfg, self.streams[worker]
        k = self.steps[worker]
        self.steps[worker] += 1
        if c.compute == "constant":
            base = c.compute_ms
        elif c.compute == "gamma":
            base = rng.gamma(c.gamma_shape, c.compute_ms / c.gamma_shape)
        elif c.compute == "lognormal":  # mean compute_ms: μ = ln(mean) − σ²/2
            base = rng.lognormal(
                math.log(c.compute_ms) - c.lognormal_sigma**2 / 2, c.lognormal_sigma
            )
        else:
            series = self.trace[worker % len(self.trace)]
            base = series[k % len(series)]
        if c.straggler_prob and rng.random() < c.straggler_prob:
            base *= c.straggler_factor
        seconds = float(base) * self.slowdown[worker] / 1000.0
        for first, end, factor in self.slowed[worker]:  # slow_compute faults in force
            if first <= k < end:
                seconds *= factor
        return seconds

    def faults(self, worker: int) -> list[FaultConfig]:
        return sorted((f for f in self.cfg.faults if f.worker == worker), key=lambda f: f.at_s)


CLUSTERS: Registry[Profile] = Registry("cluster profile", "cluster", "cluster")
CLUSTERS.register("profile", ClusterConfig)(Profile)
