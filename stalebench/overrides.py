"""What a run's command-line overrides say about its label: one rule for the CLI, which sets
the label, and the report, which reads it back from Hydra's .hydra/overrides.yaml."""

from __future__ import annotations

from collections.abc import Iterable


def keeps_preset_name(overrides: Iterable[str]) -> bool:
    """False when a part of the algorithm (`algorithm/<part>=`: a barrier, update rule,
    inner optimizer, outer rule, gossip rule, pipeline schedule or stage optimizer, or one a
    plugin adds) was swapped without `algorithm.name=`: the run is then no longer the named
    preset and is labelled by its parts (`<barrier>+<update>`, `<outer>+<inner>`, ...)."""
    overrides = [o.lstrip("+~") for o in overrides]
    swapped = any(o.startswith("algorithm/") and "=" in o for o in overrides)
    return not swapped or any(o.startswith("algorithm.name=") for o in overrides)
