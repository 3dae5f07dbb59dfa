"""A value of the wrong type for its key is refused before Hydra composes, in one line naming
the key, the value and the type the schema gives it; every value Hydra would take passes
(the conversions it makes, interpolations, sweeps, lists, a key two schemas type apart)."""

from __future__ import annotations

import pytest

from stalebench import keys, plugins
from stalebench.cli import groups
from stalebench.config import register_configs
from stalebench.errors import ConfigError


@pytest.fixture(scope="module", autouse=True)
def registered():
    plugins.load()
    register_configs()


@pytest.mark.parametrize(
    "arg",
    [
        "seed='4'",  # Hydra converts a quoted integer
        "budget.max_wall_s=1",  # an integer where a number goes
        "budget.max_wall_s=1e-3",
        "oversubscribe=yes",
        "checkpoint_every_s=null",  # Optional
        "seed=${oc.env:SEED,0}",  # resolved later
        "model.hidden=[32,32]",  # a list in one model's schema, an integer in another's
        "model.hidden=3",
        "cluster.faults=[{worker: 1, at_s: 0.5, action: die}]",  # structured items: Hydra's
        "seed=0,1,2",
        "seed=range(0,3)",
        "+seed=3",
        "~seed",
        "run_dir=3",  # a string takes a number's text
    ],
)
def test_a_value_hydra_takes_passes(arg):
    keys.check_keys([arg], groups())


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("cluster.num_workers=four", "cluster.num_workers must be an integer, got 'four'"),
        ("budget.max_wall_s=abc", "budget.max_wall_s must be a number, got 'abc'"),
        ("seed=1.5", "seed must be an integer, got 1.5"),
        ("seed=null", "seed must be an integer, got null"),
        ("seed=0,1,two", "seed must be an integer, got 'two'"),  # a sweep's every value
        ("seed=choice(0,'b')", "seed must be an integer, got 'b'"),
        ("oversubscribe=maybe", "oversubscribe must be true or false, got 'maybe'"),
        ("checkpoint_every_s=soon", "checkpoint_every_s must be a number or null, got 'soon'"),
        ("model.hidden=[a]", "model.hidden must be a list of integers or an integer, got ['a']"),
        ("eval.every_s=[1]", "eval.every_s must be a number, got [1]"),
        ("seed=[1", "seed=[1: not an override Hydra can read: no viable alternative"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_in_one_line(arg, message):
    with pytest.raises(ConfigError) as refused:
        keys.check_keys([arg], groups())
    assert str(refused.value).startswith(message)
    assert "\n" not in str(refused.value)
