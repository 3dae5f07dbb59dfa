"""`stalebench calibrate` measures this machine for the configured run and writes a cluster
profile that a run then composes (`cluster=calibrated`)."""

from __future__ import annotations

import functools

import pytest

from stalebench import calibrate
from tests.conftest import compose


@pytest.mark.timeout(120)
def test_calibrate_writes_a_profile_a_run_composes(tmp_path, monkeypatch):
    monkeypatch.setenv("STALEBENCH_CONF", str(tmp_path / "conf"))
    monkeypatch.setattr(calibrate, "PROBE_S", 0.1)  # the wiring, not the precision
    # and so one real run per probe, not the median of PROBE_REPEATS (`measure` calls it)
    monkeypatch.setattr(calibrate, "probe", functools.partial(calibrate.probe, repeats=1))
    small = ["dataset=synthetic", "model=mlp", "model.hidden=[16]"]
    written = calibrate.run(compose(small), "here")
    assert written == tmp_path / "conf" / "cluster" / "here.yaml" and written.is_file()
    cfg = compose([*small, "cluster=here", "runtime=sim"])
    c = cfg.cluster
    assert c.preset == "here" and c.compute == "constant"
    assert 0 < c.compute_ms < 1000  # a step of a 16-unit MLP, in ms
    assert 0 < c.push_latency_ms == c.pull_latency_ms < 100  # the loopback, one way
    assert c.push_bandwidth_gbps == c.pull_bandwidth_gbps > 0.01
    # k processes at once: a step at every k up to twice the cores, in the comment
    assert "processes stepping at once" in written.read_text()
    # the host: this machine's cores; the probe's real run had a server (the default job is
    # ps ASP), whose handling of a message it timed; what the simulator's step lacked
    from stalebench.runtime.compute import cores

    assert c.host_cores == cores()
    assert 0 < c.hub_ms < 1000 and c.overhead_ms >= 0
    assert "the probe (a real run of the job, 1 worker(s)" in written.read_text()
    # the wake-up: the job again with one rank more than the cores, the simulator fitted
    assert c.wake_ms >= 0 and "the wake-up probe" in written.read_text()


def test_fit_bisects_to_the_target():
    line = lambda x: 2.0 + x  # noqa: E731
    assert calibrate.fit(line, 5.0, 10.0) == pytest.approx(3.0, abs=10.0 / 256)
    assert calibrate.fit(line, 1.0, 10.0) == 0.0  # reached at 0 already
    assert calibrate.fit(line, 50.0, 10.0) == 10.0  # not within [0, hi]


def test_a_bigger_model_calibrates_to_a_longer_step():
    cfg = compose(["dataset=synthetic", "model=mlp", "model.hidden=[16]"])
    big = compose(["dataset=synthetic", "model=mlp", "model.hidden=[2048,2048]"])
    from stalebench.job import load_splits

    splits = load_splits(cfg)
    assert calibrate.step_ms(big, splits) > 4 * calibrate.step_ms(cfg, splits)


@pytest.mark.timeout(240)
def test_the_host_probe_fits_on_the_machine_alone(monkeypatch):
    """A probe given measurements that carry another job's host (what `measure` returns,
    and benchmarks/fidelity.py passes on to each family's probe) fits its own host against
    the simulator on the machine's numbers alone: a stale overhead_ms left in the baseline
    would be missing from the overhead fitted."""
    # what is checked holds at any length of the probe (the simulator is exact, whatever its
    # budget): a short one, its wake-up fit a dozen simulated runs
    monkeypatch.setattr(calibrate, "PROBE_S", 0.1)
    from stalebench import experiment
    from stalebench.config import LoggerConfig

    job = ["dataset=synthetic", "model=mlp", "model.hidden=[16]", "engine=allreduce",
           "algorithm=bsp", "timeout_s=60"]  # fmt: skip
    machine = {"step_ms": 1.0, "latency_ms": 0.1, "bandwidth_gbps": 10.0}
    stale = {"hub_ms": 3.0, "overhead_ms": 40.0, "wake_ms": 20.0}
    got = calibrate.probe(compose(job), {**machine, **stale}, 2, repeats=1)
    assert got["probe_workers"] == 2 and got["hub_ms"] == 0.0  # no hub: nothing to take
    cfg = calibrate.profiled(compose(job), {**machine, "hub_ms": 0.0}, 2, 2)
    cfg.runtime, cfg.logger, cfg.oversubscribe = "sim", LoggerConfig(name="none"), True
    cfg.budget.max_updates, cfg.budget.max_wall_s = 0, calibrate.PROBE_S
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cfg.run_dir = tmp
        summary = experiment.run(cfg)
    bare = 1000 * summary["run_time_s"] / summary["gradients"]
    assert got["probe_step_ms"]["sim"] == pytest.approx(bare)  # the simulator is exact


@pytest.mark.timeout(240)
def test_the_probe_puts_a_steps_cost_on_the_cores_and_keeps_its_cpu(monkeypatch):
    """What a real step took beyond the simulator's is all `overhead_ms` (on the cores;
    benchmarks/host_form.py kept that over splitting off a part on no core), and the real
    run's CPU and wall time a step (summary.json's `cycle`) are kept beside it."""
    # the bookkeeping, not the precision: the simulator's steps at the machine's 0.05 ms are
    # ~28,000 a virtual second, each a real gradient
    monkeypatch.setattr(calibrate, "PROBE_S", 0.1)
    job = ["dataset=synthetic", "model=mlp", "model.hidden=[16]", "engine=allreduce",
           "algorithm=bsp", "timeout_s=60"]  # fmt: skip
    machine = {"step_ms": 0.05, "latency_ms": 0.01, "bandwidth_gbps": 10.0}
    got = calibrate.probe(compose(job), machine, 2, repeats=1)
    cycle = got["probe_cycle_ms"]
    assert cycle["steps"] > 0 and 0 < cycle["cpu_ms"] and 0 < cycle["wall_ms"]
    steps = got["probe_step_ms"]
    assert got["overhead_ms"] == pytest.approx(max(0.0, 2 * (steps["real"] - steps["sim"])))
    assert "stall_ms" not in got
