"""What a run's command-line overrides say about its label: one rule for the CLI, which sets
the label, and the report, which reads it back from Hydra's .hydra/overrides.yaml."""

from __future__ import annotations

from collections.abc import Iterable


def keeps_preset_name(overrides: Iterable[str]) -> bool:
    """False when a barrier or update rule (an inner optimizer or outer rule) was swapped
    without `algorithm.name=`: the run is then no longer the named preset and is labelled by
    its parts (`<barrier>+<update>`, `<outer>+<inner>`)."""
    overrides = list(overrides)
    parts = ("algorithm/barrier=", "algorithm/update=", "algorithm/inner=", "algorithm/outer=")
    swapped = any(o.startswith(parts) for o in overrides)
    return not swapped or any(o.startswith("algorithm.name=") for o in overrides)
