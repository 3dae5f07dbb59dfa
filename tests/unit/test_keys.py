"""stalebench.keys: the schema the command line is checked against follows the registries,
a component registered after the first check included (a plugin, a test's own rule)."""

from __future__ import annotations

import dataclasses

import pytest
from hydra.core.config_store import ConfigStore

from stalebench import keys, plugins
from stalebench.algorithms import UPDATES, UpdateConfig, UpdateRule
from stalebench.config import register_configs
from stalebench.errors import ConfigError


def test_a_rule_registered_after_the_first_check_has_its_keys():
    plugins.load()
    register_configs()
    with pytest.raises(ConfigError, match="algorithm.update.zeta_test: no such config key"):
        keys.check_keys(["algorithm.update.zeta_test=2"], set())

    @dataclasses.dataclass
    class ZetaConfig(UpdateConfig):
        zeta_test: float = 1.0

    try:

        @UPDATES.register("zeta_test_rule", ZetaConfig)
        class Zeta(UpdateRule):
            """A rule of this test only."""

            def apply(self, params, grad, worker, lag):
                pass

        keys.check_keys(["algorithm.update.zeta_test=2"], set())  # known now
    finally:  # the other tests in this process see the registries as they were
        UPDATES._entries.pop("zeta_test_rule", None)
        ConfigStore.instance().repo["algorithm"]["update"].pop("zeta_test_rule.yaml", None)
    with pytest.raises(ConfigError, match="no such config key"):
        keys.check_keys(["algorithm.update.zeta_test=2"], set())
