"""Hydra's search path, extended by every stalebench plugin's `conf/` folder
(`stalebench.plugins.conf_dirs`), after stalebench's own: a plugin's presets, cluster
profiles and sweeps are chosen like the built-in ones (`algorithm=<its preset>`)."""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class StalebenchPluginConf(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        try:
            from stalebench.plugins import conf_dirs
        except ImportError:  # a stalebench older than this plugin (a checkout of an old commit)
            return
        for conf in conf_dirs():
            search_path.append(provider="stalebench-plugin", path=f"file://{conf}")
