"""The gossip rules (algorithm/gossip=) against their definitions, without processes: the
exponential graph's peers per iteration, PushSum's conservation of Σx and Σw and its exact
de-biasing (with messages in flight under overlap too), the complete graph's exact mean,
D-PSGD's symmetric doubly stochastic W, and a delay of exactly τ iterations."""

from __future__ import annotations

import pytest
import torch

from stalebench.algorithms.gossip import GOSSIP, TOPOLOGIES, MixingConfig, distances
from stalebench.errors import ConfigError


def rule(name="pushsum", n=8, **kw):
    return GOSSIP.build(MixingConfig(name=name, **kw), n)


def gossip(r, xs, ws, iterations, start=0, pending=None):
    """Run the pure rule alone (no gradients) for `iterations`; messages in flight are kept
    in `pending` {due iteration: [(receiver, message)]}; returns it."""
    pending = {} if pending is None else pending
    for k in range(start, start + iterations):
        for i in range(r.num_nodes):
            message = r.send(xs[i], ws[i], i, k)
            for peer in r.out_peers(i, k):
                pending.setdefault(k + r.delay, []).append((peer, message))
        for peer, message in pending.pop(k, []):
            r.receive(xs[peer], ws[peer], message)
    return pending


def start(n, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(d, generator=g) for _ in range(n)], [torch.ones(1) for _ in range(n)]


def test_the_exponential_graph_sends_to_i_plus_2_to_the_k_mod_log2_n():
    r = rule(n=8)
    for k in range(9):
        for i in range(8):
            assert r.out_peers(i, k) == [(i + 2 ** (k % 3)) % 8]
            assert r.in_peers(i, k) == [(i - 2 ** (k % 3)) % 8]


def test_any_number_of_nodes_takes_the_powers_below_it():
    assert distances(6, 1) == [1, 2, 4]  # ⌊log2 5⌋ + 1 = 3 phases, as fairscale's graph
    assert distances(2, 1) == [1]
    assert distances(9, 2) == [1, 2, 3, 6]  # j·3^e, j = 1, 2: fairscale's N-peer graph
    r = rule(n=6)
    assert [r.out_peers(5, k) for k in range(4)] == [[0], [1], [3], [0]]


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("n", [2, 5, 8])
def test_in_peers_are_exactly_those_that_send(topology, n):
    r = rule(n=n, topology=topology, peers=1)
    for k in range(4):
        for i in range(n):
            senders = [j for j in range(n) if i in r.out_peers(j, k)]
            assert r.in_peers(i, k) == senders
            assert i not in r.out_peers(i, k)


@pytest.mark.parametrize("overlap", [0, 1, 3])
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_pushsum_conserves_the_sums_and_debiases_to_the_exact_mean(topology, overlap):
    n = 8
    xs, ws = start(n)
    total = torch.stack(xs).sum(0)
    r = rule(n=n, topology=topology, overlap=overlap)

    def spread():
        return max(float((r.debias(x, w) - total / n).norm()) for x, w in zip(xs, ws, strict=True))

    before = spread()
    pending = gossip(r, xs, ws, 7)
    flying_x = sum((m[:-1] for due in pending.values() for _, m in due), torch.zeros(5))
    flying_w = sum(float(m[-1]) for due in pending.values() for _, m in due)
    torch.testing.assert_close(torch.stack(xs).sum(0) + flying_x, total)
    assert sum(float(w) for w in ws) + flying_w == pytest.approx(n)
    gossip(r, xs, ws, 300, start=7)  # every node's z_i tends to the mean, delayed or not
    assert spread() < 1e-3 * before


def test_under_overlap_the_weights_differ_but_the_debiased_models_agree():
    xs, ws = start(8)
    r = rule(n=8, overlap=2)
    gossip(r, xs, ws, 5)
    assert len({round(float(w), 6) for w in ws}) == 1 and float(ws[0]) < 1  # shares in flight
    zs = [r.debias(x, w) for x, w in zip(xs, ws, strict=True)]
    assert all(not torch.equal(xs[0], z) for z in zs)  # x alone is biased by w < 1


def test_the_complete_graph_averages_exactly_in_one_iteration():
    xs, ws = start(4)
    mean = torch.stack(xs).mean(0)
    gossip(rule(n=4, topology="complete"), xs, ws, 1)
    for x, w in zip(xs, ws, strict=True):
        torch.testing.assert_close(x, mean)
        assert float(w) == 1.0


def test_the_exponential_graph_averages_exactly_in_log2_n_iterations():
    xs, ws = start(8)
    mean = torch.stack(xs).mean(0)
    gossip(rule(n=8), xs, ws, 3)
    for x in xs:
        torch.testing.assert_close(x, mean)


def mixing_matrix(r, k):
    """W[i, j]: the share of node j's x that node i holds after iteration k's mixing."""
    n = r.num_nodes
    xs = [torch.eye(n)[j].clone() for j in range(n)]
    ws = [torch.ones(1) for _ in range(n)]
    gossip(r, xs, ws, 1, start=k)
    return torch.stack(xs)


@pytest.mark.parametrize("topology,n", [("ring", 5), ("ring", 2), ("complete", 6)])
def test_dpsgd_mixes_by_a_symmetric_doubly_stochastic_matrix(topology, n):
    r = rule("dpsgd", n=n, topology=topology)
    assert r.mixes_first and not r.debiases
    w = mixing_matrix(r, 0)
    torch.testing.assert_close(w, w.T)
    torch.testing.assert_close(w.sum(0), torch.ones(n))
    torch.testing.assert_close(w.sum(1), torch.ones(n))
    if topology == "ring" and n == 5:  # Lian et al.'s ring: self and both neighbours, 1/3
        assert w[0].tolist() == pytest.approx([1 / 3, 1 / 3, 0, 0, 1 / 3])


def test_the_exponential_graph_is_column_but_not_row_symmetric():
    w = mixing_matrix(rule(n=8), 0)
    torch.testing.assert_close(w.sum(0), torch.ones(8))  # column stochastic: mass conserved
    assert not torch.equal(w, w.T)  # directed: D-PSGD refuses it


@pytest.mark.parametrize("overlap", [0, 1, 2])
def test_a_message_is_taken_in_exactly_overlap_iterations_after_it_was_sent(overlap):
    r = rule(n=2, overlap=overlap)  # two nodes: each sends its half to the other
    xs, ws = [torch.ones(1), torch.zeros(1)], [torch.ones(1), torch.ones(1)]
    pending, seen = {}, []
    for k in range(overlap + 1):
        gossip(r, xs, ws, 1, start=k, pending=pending)
        seen.append(float(xs[1]))
    # node 1 holds only its own shares (of 0) until iteration τ takes node 0's first half in
    assert seen == [0.0] * overlap + [0.5]


@pytest.mark.parametrize(
    "kw,key",
    [
        (dict(topology="star"), "algorithm.gossip.topology"),
        (dict(peers=0), "algorithm.gossip.peers"),
        (dict(overlap=-1), "algorithm.gossip.overlap"),
        (dict(topology="complete", peers=2), "algorithm.gossip.peers=2"),
        (dict(topology="exponential_alternating", peers=2), "algorithm.gossip.peers=2"),
    ],
)
def test_bad_settings_name_the_key(kw, key):
    with pytest.raises(ConfigError, match=key):
        MixingConfig(name="pushsum", **kw)


@pytest.mark.parametrize(
    "name,kw,n,key",
    [
        ("dpsgd", dict(), 4, "algorithm.gossip.topology=exponential"),
        ("dpsgd", dict(topology="exponential_alternating"), 4, "topology=exponential_alternating"),
        ("dpsgd", dict(topology="ring", overlap=1), 4, "algorithm.gossip.overlap=1"),
        ("pushsum", dict(), 1, "cluster.num_workers=1"),
        ("pushsum", dict(peers=4), 4, "algorithm.gossip.peers=4"),
    ],
)
def test_what_a_rule_cannot_run_on_n_nodes_is_refused(name, kw, n, key):
    with pytest.raises(ConfigError, match=key):
        rule(name, n=n, **kw)
