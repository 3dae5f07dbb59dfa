"""stalebench's Hydra sweeper: Hydra's basic sweeper, plus the tuning protocol of a sweep
with a `sweep.tune` block (docs/design.md, "Tuning protocol"). Hydra finds it in the
`hydra_plugins` namespace package; conf/config.yaml makes it the default sweeper."""
