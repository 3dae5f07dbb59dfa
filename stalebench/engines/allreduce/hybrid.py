"""engine=allreduce with `engine.model_parallel`: hybrid parallelism (Das et al., 2016, for
the fully connected layers): the chosen linear layers are split over the N ranks (each holds
1/N of a layer's outputs), the rest of the net data-parallel.

A model-parallel layer needs every rank's input rows: its input activations are all-gathered
in the forward pass (each rank brings its b examples × the layer's inputs) and their
gradient reduce-scattered in the backward pass (the same bytes a rank, as a ring moves
them); the last such layer's outputs go back to their examples' ranks the same way, forward
and backward. Those exchanges stand in the step's way (a layer cannot start before its
input is in): their time is added to the step. The layers' weight gradients are complete on
the rank that holds them (it saw all N·b examples), so they are not all-reduced: the round's
all-reduce carries the data-parallel rest. Each rank's arithmetic is the same as data
parallelism's (b examples through the whole layer, or N·b through 1/N of it), and so is the
update, so the values computed are data parallelism's; what changes is the clock.

Priced in the simulator (both the numeric and the cost-only one); real processes would have
to exchange the activations themselves, which engine=allreduce does not do: refused there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from stalebench.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Hybrid:
    tensors: frozenset[int]  # the net's parameter tensors (by index) held model-parallel
    elements: int  # their elements, which the round's all-reduce does not carry
    exchanges: tuple[int, ...]  # the bytes a rank brings to each all-gather (forward)

    @classmethod
    def of(cls, net: torch.nn.Module, names: list[str], batch: int) -> Hybrid:
        """The layers of `net` named (a module's qualified name or its class's name) by
        `engine.model_parallel`, for a rank's minibatch of `batch` examples."""
        index = {id(p): i for i, p in enumerate(net.parameters())}
        chosen = [
            (name, m) for name, m in net.named_modules()
            if name in names or type(m).__name__ in names
        ]  # fmt: skip
        unmatched = [n for n in names if not any(n in (q, type(m).__name__) for q, m in chosen)]
        if unmatched:
            raise ConfigError(
                f"engine.model_parallel: {unmatched[0]!r} names no module of the model (give "
                "a module's name, as named_modules() has it, or its class, e.g. Linear)"
            )
        for name, m in chosen:
            if not isinstance(m, torch.nn.Linear):
                raise ConfigError(
                    f"engine.model_parallel: {name!r} is a {type(m).__name__}, no linear "
                    "layer: only linear layers are split over the ranks"
                )
        tensors = frozenset(index[id(p)] for _, m in chosen for p in m.parameters())
        elements = sum(p.numel() for _, m in chosen for p in m.parameters())
        exchanges = [4 * batch * m.in_features for _, m in chosen]
        last = [m for m in net.modules() if any(True for _ in m.parameters(recurse=False))][-1]
        if chosen and chosen[-1][1] is last:  # its outputs feed the loss: back to their ranks
            exchanges.append(4 * batch * last.out_features)
        return cls(tensors, elements, tuple(exchanges))

    def seconds(self, price: Callable[[int], float]) -> float:
        """A step's exchanges, each priced by the runtime (`World.exchange_s`) and paid
        twice: all-gathered forward and reduce-scattered backward (a ring's reduce-scatter
        moves what its all-gather does)."""
        return sum(2 * price(nbytes) for nbytes in self.exchanges)
