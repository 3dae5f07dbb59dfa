"""Engines: the training protocols, as pure state machines driven by a runtime."""
