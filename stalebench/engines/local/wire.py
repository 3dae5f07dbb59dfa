"""The names of engine=local's wire formats (how a round's Δ travels), without torch: the
engine's config checks them, `round.WIRES` maps them to dtypes."""

QUANTIZE = ("none", "fp16", "int8")  # float32, float16, int8 with a scale per tensor
