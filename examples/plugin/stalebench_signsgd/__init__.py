"""An out-of-tree stalebench plugin: one config dataclass, one class, one decorator.

Install it (`pip install -e examples/plugin`) and select it from the command line:
    stalebench algorithm/update=signsgd algorithm.update.lr=0.001
"""

from __future__ import annotations

import dataclasses

from stalebench.algorithms import UPDATES, UpdateConfig, UpdateRule


@dataclasses.dataclass
class SignSGDConfig(UpdateConfig):
    lr: float = 0.001


@UPDATES.register("signsgd", SignSGDConfig)
class SignSGD(UpdateRule):
    """signSGD (Bernstein et al., ICML 2018): θ ← θ − η·sign(g + wd·θ).

    η is `self.lr`, the scheduled learning rate every rule reads (η/N → η over
    `warmup_updates`), not `self.cfg.lr`, which would skip the warm-up."""

    def apply(self, params, grad, worker, lag):
        step = grad.add(params, alpha=self.cfg.weight_decay) if self.cfg.weight_decay else grad
        params.add_(step.sign(), alpha=-self.lr)
