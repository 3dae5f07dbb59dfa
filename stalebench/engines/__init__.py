"""Engines: how a run trains. Importing this package registers the built-in engines
(`ps`, `allreduce`, `pipeline`, `local`, `gossip`) without importing their programs or
torch (`Engine.load_programs` does, in a process that runs one); see `base` for the
contract a new one implements."""

from stalebench.engines import allreduce, gossip, local, pipeline, ps  # noqa: F401  (registers built-ins)
from stalebench.engines.base import ENGINES, Engine, EngineConfig  # noqa: F401
