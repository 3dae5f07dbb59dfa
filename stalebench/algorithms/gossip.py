"""Gossip (decentralised) averaging: who sends what to whom at each iteration, with no server
(`algorithm/gossip=`). Every node i holds a numerator x_i and a weight w_i (1 at the start);
at iteration k it keeps the share 1/(m + 1) of both and sends the same share to each of its
m out-peers, which add what they receive (uniform mixing, as fairscale's `UniformMixing`).
The matrix this applies is column stochastic, so Σ x and Σ w are conserved; the model node
i evaluates its gradient at is z_i = x_i / w_i (PushSum's de-biasing).

    pushsum  Stochastic Gradient Push (Assran et al., ICML 2019): the local step on x_i,
             then the PushSum step; `overlap` τ ≥ 1: OSGP, a message sent at iteration k is
             taken in at k + τ (the sender keeps only its own share at once)
    dpsgd    D-PSGD (Lian et al., NeurIPS 2017): a symmetric doubly stochastic W on a fixed
             graph, x_i ← Σ_j W_ij x_j − γ∇f(x_i), the gradient at x_i before the mixing

Topologies (`topology`), each node's out-peers at iteration k:

    exponential  time-varying directed exponential graph: the `peers` = p distances
                 j·(p+1)^e (j = 1..p, e = 0, 1, … while (p+1)^e ≤ N − 1, those < N) taken p
                 at a time in turn; p = 1: i + 2^(k mod (⌊log2(N − 1)⌋ + 1)), fairscale's
                 `NPeerDynamicDirectedExponentialGraph`, any N (not only powers of two)
    exponential_alternating
                 the SGP paper's graph (its job scripts' --graph_type 0, the SGP repository's
                 `DynamicDirectedExponentialGraph`): one peer, i + h_k, the signed hops
                 +1, −1, +2, −2, …, +2^m, −2^m (m = ⌊log2(N − 1)⌋) taken in turn, h_k the
                 (k mod 2(m + 1))-th; peers = 1 only
    ring         fixed, undirected: i ± 1, …, i ± p (D-PSGD's ring: p = 1, weight 1/3 each)
    complete     every other node, weight 1/N: one exact averaging per iteration

Pure: flat tensors in, tensors changed in place; how messages travel (gloo, a virtual
clock) is the engine's business.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

from stalebench.errors import ConfigError
from stalebench.registry import ComponentConfig, Part, Registry

if TYPE_CHECKING:
    import torch

TOPOLOGIES = ("exponential", "exponential_alternating", "ring", "complete")
DIRECTED = ("exponential", "exponential_alternating")  # time-varying, one direction a hop


@dataclasses.dataclass
class MixingConfig(ComponentConfig):
    topology: str = "exponential"  # one of TOPOLOGIES (see the module's docstring)
    peers: int = 1  # p: out-peers per iteration (exponential), neighbours each side (ring)
    # τ: iterations from a message's send to its merge (0: within the iteration; OSGP: τ ≥ 1)
    overlap: int = 0

    def __post_init__(self) -> None:
        if self.topology not in TOPOLOGIES:
            raise ConfigError(
                f"algorithm.gossip.topology must be one of {', '.join(TOPOLOGIES)}, "
                f"got {self.topology!r}"
            )
        if self.peers < 1:
            raise ConfigError(f"algorithm.gossip.peers must be >= 1, got {self.peers}")
        if self.overlap < 0:
            raise ConfigError(f"algorithm.gossip.overlap must be >= 0, got {self.overlap}")
        if self.topology == "complete" and self.peers != 1:
            raise ConfigError(
                f"algorithm.gossip.peers={self.peers}: topology=complete sends to every node"
            )
        if self.topology == "exponential_alternating" and self.peers != 1:
            raise ConfigError(
                f"algorithm.gossip.peers={self.peers}: topology=exponential_alternating is the "
                "SGP paper's one-peer graph (topology=exponential takes several)"
            )


def distances(num_nodes: int, peers: int) -> list[int]:
    """The exponential graph's hop distances, in the order they are taken."""
    out, base, scale = [], peers + 1, 1
    while scale <= num_nodes - 1:
        out += [j * scale for j in range(1, peers + 1) if j * scale < num_nodes]
        scale *= base
    return out


def alternating_hops(num_nodes: int) -> list[int]:
    """The SGP paper's graph's signed hops, in the order they are taken: +2^e, then −2^e, for
    e = 0 … ⌊log2(N − 1)⌋. Like the reference, which lists both without removing a repeat,
    it keeps +2^m and −2^m when they reach the same peer (N = 2^(m+1)): one iteration each."""
    return [sign * 2**e for e in range((num_nodes - 1).bit_length()) for sign in (1, -1)]


class Mixing(Part):
    """One gossip rule on N nodes: the graph at each iteration and the arithmetic of a step."""

    # the weight w travels and divides x (PushSum); without it z = x (W doubly stochastic)
    debiases: ClassVar[bool] = True
    # mix the iteration's x before the local step (D-PSGD) instead of after it (SGP)
    mixes_first: ClassVar[bool] = False

    def __init__(self, cfg: MixingConfig, num_nodes: int):
        self.cfg, self.num_nodes = cfg, num_nodes
        self.check(cfg, num_nodes)
        self.hops: list[int] = []  # a directed topology's signed distances, p at a time in turn
        if cfg.topology == "exponential":
            self.hops = distances(num_nodes, cfg.peers)
        elif cfg.topology == "exponential_alternating":
            self.hops = alternating_hops(num_nodes)

    @classmethod
    def check(cls, cfg: MixingConfig, num_nodes: int, run: Any = None) -> None:
        """Refuse what this rule cannot run on N nodes, in `run` when given (ConfigError
        naming the key)."""
        if num_nodes < 2:
            raise ConfigError(f"cluster.num_workers={num_nodes}: gossip needs at least 2 nodes")
        hops = len(distances(num_nodes, cfg.peers))
        if cfg.topology == "exponential" and cfg.peers > hops:
            raise ConfigError(
                f"algorithm.gossip.peers={cfg.peers} exceeds the {hops} distinct out-peers of "
                f"the exponential graph on cluster.num_workers={num_nodes}"
            )
        quorum = run.cluster.min_replicas if run is not None else 0
        if quorum and cfg.overlap:
            raise ConfigError(
                f"cluster.min_replicas={quorum}: with algorithm.gossip.overlap={cfg.overlap} the "
                "shares sent to a lost node in the last τ iterations cannot come back; use "
                "overlap 0 (SGP, D-PSGD)"
            )

    @property
    def delay(self) -> int:
        return self.cfg.overlap

    def out_peers(self, node: int, k: int) -> list[int]:
        """Where node sends at iteration k (0-based), never itself, each once."""
        n, p = self.num_nodes, self.cfg.peers
        if self.cfg.topology == "complete":
            return [j for j in range(n) if j != node]
        if self.cfg.topology == "ring":
            near = {(node + s * d) % n for d in range(1, p + 1) for s in (1, -1)} - {node}
            return sorted(near)
        hops = self.hops
        return [(node + hops[(k * p + g) % len(hops)]) % n for g in range(p)]

    def in_peers(self, node: int, k: int) -> list[int]:
        """Who sends to node at iteration k, in rank order (the order messages are added)."""
        if self.cfg.topology not in DIRECTED:
            return self.out_peers(node, k)  # the graph is undirected
        n, p, hops = self.num_nodes, self.cfg.peers, self.hops
        return sorted((node - hops[(k * p + g) % len(hops)]) % n for g in range(p))

    def send(self, x: torch.Tensor, w: torch.Tensor, node: int, k: int) -> torch.Tensor:
        """Keep node's own share of (x, w) in place; returns the message [x | w], the same
        share, that goes to each out-peer."""
        import torch

        share = 1.0 / (len(self.out_peers(node, k)) + 1)
        x.mul_(share)
        w.mul_(share)
        return torch.cat([x, w])

    @staticmethod
    def receive(x: torch.Tensor, w: torch.Tensor, message: torch.Tensor) -> None:
        """Add a message [x | w] that has arrived."""
        x.add_(message[:-1])
        w.add_(message[-1:])

    def debias(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """z = x / w, the model the node computes its gradient at (a new tensor)."""
        return x / w if self.debiases else x.clone()


GOSSIP: Registry[Mixing] = Registry(
    "gossip rule", "algorithm/gossip", "algorithm.gossip", MixingConfig
)


@GOSSIP.register("pushsum", MixingConfig)
class PushSum(Mixing):
    """PushSum after the local step (SGP; OSGP with overlap τ ≥ 1): x and w mixed by a
    column-stochastic matrix, the gradient taken at z = x / w (Assran et al., ICML 2019)."""


@GOSSIP.register("dpsgd", MixingConfig)
class DPSGD(Mixing):
    """D-PSGD (Lian et al., NeurIPS 2017): x_i ← Σ_j W_ij x_j − γ∇f(x_i), W symmetric and
    doubly stochastic on a fixed undirected graph (ring or complete), no delay."""

    debiases = False
    mixes_first = True

    @classmethod
    def check(cls, cfg: MixingConfig, num_nodes: int, run: Any = None) -> None:
        super().check(cfg, num_nodes, run)
        if cfg.topology in DIRECTED:
            raise ConfigError(
                f"algorithm.gossip.topology={cfg.topology}: D-PSGD needs a symmetric W on a "
                "fixed undirected graph; use ring or complete (or algorithm/gossip=pushsum)"
            )
        if cfg.overlap:
            raise ConfigError(
                f"algorithm.gossip.overlap={cfg.overlap}: D-PSGD mixes without delay; "
                "delayed messages are OSGP's (algorithm/gossip=pushsum)"
            )
