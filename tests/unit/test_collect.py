"""stalebench.report.collect in-process: the Hydra config.yaml reader and the labels of a run
that wrote no summary.json, on run directories built in the formats a run writes."""

import json

import pytest

from stalebench.report.collect import _yaml_scalars, collect

# .hydra/config.yaml as Hydra wrote it for `runtime=sim dataset=synthetic model=mlp
# budget.max_updates=20 budget.max_wall_s=0 logger=none` (the default ssp preset)
CONFIG_YAML = """\
algorithm:
  name: ssp
  barrier:
    name: ssp
    apply: per_arrival
    staleness: 3
  update:
    name: sgd
    lr: 0.1
    weight_decay: 0.0
    warmup_updates: 0
  pipeline: null
  optimizer: null
model:
  name: mlp
  hidden:
  - 100
  - 100
dataset:
  name: synthetic
  batch_size: 32
  sharding: auto
  num_train: 4000
  num_test: 1000
  num_features: 20
  num_classes: 4
  separation: 1.0
  data_seed: 0
cluster:
  name: profile
  preset: heterogeneous
  num_workers: 4
  compute: constant
  compute_ms: 20.0
  gamma_shape: 100.0
  lognormal_sigma: 0.5
  trace_file: ''
  slowdown: []
  slow_fraction: 0.5
  slow_factor: 2.0
  slow_factor_max: 3.0
  straggler_prob: 0.0
  straggler_factor: 5.0
  push_latency_ms: 0.0
  pull_latency_ms: 0.0
  push_bandwidth_gbps: 0.0
  pull_bandwidth_gbps: 0.0
  faults: []
logger:
  name: none
  project: stalebench
  wandb_mode: offline
budget:
  max_updates: 20
  max_wall_s: 0.0
  target_accuracy: 0.6
eval:
  every_updates: 0
  every_s: 1.0
  train_samples: 1000
  batch_size: 1000
sweep:
  name: ''
  paper: ''
  scale: small
  params: {}
  claims: []
runtime: sim
engine:
  name: ps
device: auto
seed: 0
num_threads: 1
timeout_s: 60.0
grace_s: 120.0
run_dir: ''
"""
OVERRIDES = [
    "runtime=sim",
    "dataset=synthetic",
    "model=mlp",
    "budget.max_updates=20",
    "budget.max_wall_s=0",
    "logger=none",
]
# the same run with `algorithm/barrier=asp` added: Hydra's config keeps the preset's name
# (ssp), while the run, and its start event, is labelled asp+sgd
SWAPPED_CONFIG_YAML = CONFIG_YAML.replace(
    "    name: ssp\n    apply: per_arrival\n    staleness: 3\n",
    "    name: asp\n    apply: per_arrival\n",
)
# an older config: no engine section, and the preset emptied on the command line
# (`cluster.preset=''`)
NO_PRESET_CONFIG_YAML = CONFIG_YAML.replace("  preset: heterogeneous\n", "  preset: ''\n").replace(
    "engine:\n  name: ps\n", ""
)

START = {
    "kind": "system",
    "t": 0.0,
    "event": "start",
    "sharding": "disjoint",
    "algorithm": "asp+sgd",
    "barrier": "asp",
    "update_rule": "sgd",
    "engine": "ps",
    "runtime": "sim",
    "model": "mlp",
    "dataset": "synthetic",
    "cluster": "heterogeneous",
    "num_workers": 4,
    "seed": 0,
}
UPDATES = [
    {
        "kind": "update",
        "t": t,
        "version": v,
        "lag": v - 1,
        "worker": v - 1,
        "clock": 0,
        "loss": 1.4,
        "compute_s": t,
        "wait_s": 0.0,
        "comm_s": 0.0,
        "clock_gap": 0,
    }
    for v, t in ((1, 0.02), (2, 0.02), (3, 0.04))
]
END = {
    "kind": "system",
    "t": 0.04,
    "event": "end",
    "status": "completed",
    "updates": 3,
    "bytes_sent": 0,
    "virtual_time": True,
}


def make_run_without_summary(tmp_path, config_yaml, events_text, overrides=OVERRIDES):
    """A run directory as a run leaves it when it dies before summary.json."""
    run = tmp_path / "multirun" / "0"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(config_yaml)
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (run / "events.jsonl").write_text(events_text)
    return run


def jsonl(events):
    return "".join(json.dumps(e) + "\n" for e in events)


def test_yaml_scalars_dotted_keys_of_nested_mappings_without_comments_or_list_items():
    text = """\
# Hydra's resolved config: comments, blank lines, lists and quoted values
algorithm:
  name: ssp
  barrier:
    name: ssp
    staleness: 3
  update:
    name: 'sgd'
  pipeline: null

model:
  name: mlp
  hidden:
  - 100
  - 100
cluster:
  # the preset: the profile's name in reports
  preset: "heterogeneous"
  num_workers: 4
  trace_file: ''
  faults:
  - worker: 1
device: XPU
run_dir: 'outputs/2024-01-02/10:20:30'
seed: 0
"""
    assert _yaml_scalars(text) == {
        "algorithm.name": "ssp",
        "algorithm.barrier.name": "ssp",
        "algorithm.barrier.staleness": "3",
        "algorithm.update.name": "sgd",
        "algorithm.pipeline": "null",
        "model.name": "mlp",
        "cluster.preset": "heterogeneous",
        "cluster.num_workers": "4",
        "cluster.trace_file": "",
        "device": "XPU",
        "run_dir": "outputs/2024-01-02/10:20:30",
        "seed": "0",
    }


# a run's length as collect says it (`with_clock`): on its clock (runtime=sim: simulated),
# under the old key too for the readers that still name it
def length(seconds, clock="simulated"):
    return {"clock": clock, "run_time_s": seconds, "wall_time_s": seconds}


FAILED = {"status": "failed", "error": "no summary.json"}


@pytest.mark.parametrize(
    ("config_yaml", "labels"),
    [
        (
            CONFIG_YAML,
            {
                "algorithm": "ssp",
                "cluster": "heterogeneous",  # the preset, not cluster.name
                "num_workers": 4,
                "seed": 0,
                "runtime": "sim",
                "engine": "ps",
            },
        ),
        (
            NO_PRESET_CONFIG_YAML,
            {
                "algorithm": "ssp",
                "cluster": "profile",  # no preset: cluster.name
                "num_workers": 4,
                "seed": 0,
                "runtime": "sim",
            },
        ),
    ],
    ids=["preset", "no-preset-no-engine"],
)
def test_a_run_that_died_writing_its_start_event_is_labelled_from_hydra_config(
    tmp_path, config_yaml, labels
):
    # the run died while writing its first line: no event is readable
    run = make_run_without_summary(
        tmp_path, config_yaml, '{"kind": "system", "t": 0.0, "event": "start", "shar'
    )
    runs, curves, updates = collect([tmp_path])
    assert runs.to_dict("records") == [
        {
            "run_dir": str(run.resolve()),
            **labels,
            **FAILED,
            **length(None),
            "updates": 0,
        }
    ]
    assert curves.empty and updates.empty


def test_a_run_without_summary_keeps_every_label_of_its_start_event(tmp_path):
    # killed during the final evaluation: the end event is written, summary.json is not;
    # the barrier was swapped on the command line, so config.yaml still names the preset
    run = make_run_without_summary(
        tmp_path,
        SWAPPED_CONFIG_YAML,
        jsonl([START, *UPDATES, END]),
        [*OVERRIDES, "algorithm/barrier=asp"],
    )
    runs, _, updates = collect([tmp_path])
    assert runs.to_dict("records") == [
        {
            "run_dir": str(run.resolve()),
            "algorithm": "asp+sgd",
            "cluster": "heterogeneous",
            "num_workers": 4,
            "seed": 0,
            **FAILED,
            "sharding": "disjoint",
            "barrier": "asp",
            "update_rule": "sgd",
            "engine": "ps",
            "runtime": "sim",
            "model": "mlp",
            "dataset": "synthetic",
            **length(0.04),
            "updates": 3,
        }
    ]
    assert list(updates["algorithm"]) == ["asp+sgd"] * 3


def test_labels_come_from_the_config_not_from_another_system_event(tmp_path):
    # the start line is unreadable and not the last: the end event must not stand in for it
    make_run_without_summary(tmp_path, CONFIG_YAML, "\0" * 16 + "\n" + jsonl([*UPDATES, END]))
    with pytest.warns(UserWarning, match="events.jsonl: line 1 does not parse"):
        runs, _, _ = collect([tmp_path])
    row = runs.to_dict("records")[0]
    del row["run_dir"]
    assert row == {
        "algorithm": "ssp",
        "cluster": "heterogeneous",
        "num_workers": 4,
        "seed": 0,
        **FAILED,
        "runtime": "sim",
        "engine": "ps",
        **length(0.04),
        "updates": 3,
    }


@pytest.mark.parametrize(
    ("extra", "label"),
    [
        (["algorithm/barrier=asp"], "asp+sgd"),  # no longer the ssp preset, as the CLI says
        (["algorithm/barrier=asp", "algorithm.name=mine"], "mine"),  # named on purpose
        (["algorithm.barrier.staleness=4"], "ssp"),  # a field changed: still the preset
    ],
    ids=["swapped", "swapped-and-named", "field-changed"],
)
def test_a_run_without_events_is_labelled_as_the_cli_labels_it(tmp_path, extra, label):
    # Hydra's config.yaml keeps the preset's name when a barrier is swapped; the CLI then
    # labels the run <barrier>+<update> (summary.json and the start event say so), unless
    # algorithm.name is set too
    config = SWAPPED_CONFIG_YAML if "algorithm/barrier=asp" in extra else CONFIG_YAML
    if "algorithm.name=mine" in extra:
        config = config.replace("  name: ssp\n", "  name: mine\n", 1)
    make_run_without_summary(tmp_path, config, "", [*OVERRIDES, *extra])
    runs, _, _ = collect([tmp_path])
    assert runs.loc[0, "algorithm"] == label


ALGORITHM_YAML = CONFIG_YAML[: CONFIG_YAML.index("model:")]
# a pipeline run composed without a preset: no name, a schedule and an optimizer
PIPELINE_CONFIG_YAML = CONFIG_YAML.replace(
    ALGORITHM_YAML,
    "algorithm:\n  name: ''\n  barrier: null\n  update: null\n"
    "  pipeline:\n    schedule: gpipe\n    microbatches: 4\n"
    "  optimizer:\n    name: adamw\n    lr: 0.001\n",
)
# the diloco preset with its outer rule swapped (`algorithm/outer=average`)
LOCAL_CONFIG_YAML = CONFIG_YAML.replace(
    ALGORITHM_YAML,
    "algorithm:\n  name: diloco\n  barrier: null\n  update: null\n"
    "  inner:\n    name: adamw\n    lr: 0.0004\n"
    "  outer:\n    name: average\n    inner_steps: 50\n",
)
# the ssp preset with its update rule swapped (`algorithm/update=gap_aware`)
UPDATE_SWAPPED_CONFIG_YAML = CONFIG_YAML.replace("    name: sgd\n", "    name: gap_aware\n")
# a config.yaml whose algorithm has a name but neither half of a label
PARTLESS_CONFIG_YAML = CONFIG_YAML.replace(
    ALGORITHM_YAML, "algorithm:\n  name: ssp\n  barrier: null\n  update: null\n"
)


@pytest.mark.parametrize(
    ("config", "overrides_lines", "label"),
    [
        (CONFIG_YAML, None, "ssp"),  # no overrides.yaml: nothing was swapped
        (SWAPPED_CONFIG_YAML, ["- 'algorithm/barrier=asp'"], "asp+sgd"),  # quoted by YAML
        (UPDATE_SWAPPED_CONFIG_YAML, ["- algorithm/update=gap_aware"], "ssp+gap_aware"),
        (PIPELINE_CONFIG_YAML, ["- engine=pipeline"], "gpipe+adamw"),
        (LOCAL_CONFIG_YAML, ["- algorithm=diloco", "- algorithm/outer=average"], "average+adamw"),
        (LOCAL_CONFIG_YAML, ["- algorithm=diloco", "- algorithm/inner=sgd"], "average+adamw"),
        (PARTLESS_CONFIG_YAML, ["- algorithm/barrier=asp"], "ssp"),  # no halves: the name
    ],
    ids=[
        "no-overrides-file",
        "quoted-override",
        "update-swapped",
        "pipeline",
        "outer-swapped",
        "inner-swapped",
        "no-halves",
    ],  # fmt: skip
)
def test_the_label_from_config_yaml_follows_the_overrides_file(
    tmp_path, config, overrides_lines, label
):
    run = make_run_without_summary(tmp_path, config, "")
    overrides = run / ".hydra" / "overrides.yaml"
    if overrides_lines is None:
        overrides.unlink()
    else:
        overrides.write_text("".join(f"{line}\n" for line in overrides_lines))
    runs, _, _ = collect([tmp_path])
    assert runs.loc[0, "algorithm"] == label


def test_the_start_events_labels_win_over_config_yaml(tmp_path):
    # config.yaml is only the fallback for what the start event does not say
    config = CONFIG_YAML.replace("  num_workers: 4\n", "  num_workers: 8\n").replace(
        "\nseed: 0\n", "\nseed: 5\n"
    )
    start = {k: v for k, v in START.items() if k != "seed"}
    make_run_without_summary(tmp_path, config, jsonl([start]))
    runs, _, _ = collect([tmp_path])
    assert runs.loc[0, ["algorithm", "num_workers", "seed"]].tolist() == ["asp+sgd", 4, 5]


@pytest.mark.parametrize(
    ("overrides", "label"),
    [
        (["algorithm=sgp", "algorithm/gossip=dpsgd"], "dpsgd+momentum"),
        (["algorithm=diloco", "algorithm/outer=average"], "average+adamw"),
        (["algorithm=sgp"], "sgp"),
    ],
    ids=["gossip-part-swapped", "local-part-swapped", "preset"],
)
def test_a_job_refused_after_its_config_was_read_is_labelled_as_its_run_would_be(
    tmp_path, overrides, label
):
    # a multirun job refused by its engine's check: the label is the config's own (its
    # engine's slots), which .hydra/config.yaml alone cannot give for every engine
    from stalebench.cli import _record_invalid
    from stalebench.errors import ConfigError
    from tests.conftest import compose

    cfg = compose(["runtime=sim", *overrides])
    _record_invalid(tmp_path, ConfigError("refused"), cfg)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["status"], summary["error"], summary["algorithm"]) == (
        "invalid",
        "refused",
        label,
    )


@pytest.mark.parametrize(
    ("overrides", "label"),
    [
        (["algorithm=ssp", "algorithm/barrier=asp"], "asp+sgd"),
        (["algorithm=sgp", "algorithm/gossip=dpsgd"], "dpsgd+momentum"),
        (["algorithm=diloco", "algorithm/outer=average"], "average+adamw"),
        (["algorithm=gpipe", "algorithm/optimizer=nadamw"], "gpipe+nadamw"),
        (["algorithm=sgp"], "sgp"),
    ],
    ids=["ps", "gossip", "local", "pipeline", "preset"],
)
def test_a_run_killed_before_its_start_event_is_labelled_by_the_parts_its_config_holds(
    tmp_path, overrides, label
):
    # .hydra/config.yaml as Hydra writes it for the command (the parts the engine does not
    # read are null there): the label its run would give, `<how>+<optimizer>`, for every
    # engine; the preset's name while no part was swapped
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from stalebench.config import register_configs
    from tests.conftest import compose

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module("stalebench.conf", version_base=None):
            config_yaml = OmegaConf.to_yaml(hydra_compose("config", overrides=overrides))
    finally:
        GlobalHydra.instance().clear()
    make_run_without_summary(tmp_path, config_yaml, "", [*OVERRIDES, *overrides])
    runs, _, _ = collect([tmp_path])
    assert runs.loc[0, "algorithm"] == label == compose(overrides).label


def write_summary(tmp_path, name, summary):
    run = tmp_path / name
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(summary))
    return run


LABELS = {"status": "completed", "algorithm": "asp", "cluster": "c", "num_workers": 2, "seed": 0}


def test_an_old_summary_with_only_wall_time_is_read_on_its_runtimes_clock(tmp_path):
    # summary.json before it said its clock: `wall_time_s` (virtual in runtime=sim) and the
    # runtime; collect says both runs' times as a new summary does, in one place
    write_summary(tmp_path, "0", {**LABELS, "runtime": "sim", "wall_time_s": 7.5})
    write_summary(tmp_path, "1", {**LABELS, "runtime": "real", "wall_time_s": 2.25})
    write_summary(tmp_path, "2", {**LABELS, "wall_time_s": 1.0})  # no runtime: clock unknown
    runs, _, _ = collect([tmp_path])
    got = runs[["clock", "run_time_s", "wall_time_s"]].astype(object)
    got = got.where(got.notna(), None).to_dict("records")  # pandas' NaN: no clock
    assert got == [length(7.5), length(2.25, "real"), length(1.0, None)]


def test_a_new_summary_keeps_its_clock_and_length(tmp_path):
    # written by this version: `clock` and `run_time_s`, no `wall_time_s`; the clock it
    # names wins over the runtime's
    write_summary(tmp_path, "0", {**LABELS, "runtime": "sim", "clock": "simulated",
                                  "run_time_s": 3.0})  # fmt: skip
    write_summary(tmp_path, "1", {**LABELS, "runtime": "sim", "clock": "real", "run_time_s": 4.0})
    runs, _, _ = collect([tmp_path])
    got = runs[["clock", "run_time_s", "wall_time_s"]].to_dict("records")
    assert got == [length(3.0), length(4.0, "real")]
