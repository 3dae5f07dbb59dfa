"""Exceptions that carry a message meant for the user, printed as one line by the CLI."""


class ConfigError(ValueError):
    """Bad input: names the config key, the value and what would be valid."""


class RunError(RuntimeError):
    """A run that cannot go on (dead peer, timeout, deadlock); the message names the culprit."""
