"""The algorithms' parts, pure (tensors and clocks in, decisions and tensors out): barriers
and update rules (torch's optimizers among them), pipeline schedules and stage optimizers,
local-update outer rules and inner optimizers, gossip's mixing rules; importing this
package registers the built-ins."""

from stalebench.algorithms import (  # noqa: F401
    barriers,
    dana,
    dssp,
    gba,
    gossip,
    local,
    pipeline,
    psp,
    staleness,
    torch_optim,
    updates,
)
from stalebench.algorithms.base import (  # noqa: F401
    BARRIERS,
    UPDATES,
    Barrier,
    BarrierConfig,
    UpdateConfig,
    UpdateRule,
)
