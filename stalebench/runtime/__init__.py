"""Runtimes feed the engines' state machines: real processes (and, later, simulation)."""
