"""The runtimes that run an engine's programs: real processes over torch.distributed
(`launch`, `real.RealWorld`) and the deterministic simulator (`sim`), both pricing every
step and message by one network and compute model (`network`, `compute`, `faults`)."""
