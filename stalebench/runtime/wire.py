"""A message as an engine lays it out: a `head` of float32 slots the protocol reads (each
rank's statistics, a stop word: values every run carries), then a `payload` (a gradient, θ).

With numerics (every run but a cost-only one) the message is one float32 tensor, `buf`,
of which `head` and `payload` are views: what the world sends or all-reduces, in host
memory (page-locked, `pinned`, for a rank on a GPU: its copies to and from the device are
then asynchronous). In a
cost-only run (`sim.numerics=false`) the payload has no values — a tensor on the meta
device, its size and no storage — and `buf` is the head alone, while `nbytes` still says
what the whole message weighs: the world charges the wire for it (its `nbytes=`), so the
clock is the one a run with values would have, at no memory and no arithmetic for a
paper-sized model. With numerics `nbytes` is None: the world prices `buf` itself, as it
always has.
"""

from __future__ import annotations

import torch


class Message:
    __slots__ = ("buf", "head", "payload", "nbytes", "slots")

    def __init__(self, head: int, payload: int, numerics: bool = True, pinned: bool = False):
        self.slots = head + payload
        if numerics:
            self.buf = torch.zeros(self.slots, pin_memory=pinned)  # pinned: CUDA only
            self.head, self.payload = self.buf[:head], self.buf[head:]
            self.nbytes: int | None = None
        else:
            self.buf = self.head = torch.zeros(head)
            self.payload = torch.zeros(payload, device="meta")
            self.nbytes = 4 * self.slots

    @property
    def size(self) -> int:
        """The whole message's bytes on the wire, head and payload."""
        return 4 * self.slots
