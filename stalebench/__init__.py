"""stalebench: distributed training under staleness, in real processes."""

__version__ = "0.1.0"
