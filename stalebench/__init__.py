"""stalebench: distributed training under staleness, every paradigm (parameter servers,
all-reduce, pipelines, local updates, gossip) on one time axis, in real processes over
torch.distributed or in a deterministic simulator running the same programs."""

__version__ = "0.1.0"
