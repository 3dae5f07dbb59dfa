"""engine=allreduce's rounds in pieces: how the buffer is cut (DDP-like buckets, P3's
slices), the order every rank all-reduces them in (P3's priority replayed on the model),
a round's update applied piece by piece against the whole, the emulated link's clock, and
the simulator's bucketed round — each against numbers worked out by hand."""

import time

import pytest
import torch

from stalebench.algorithms.base import UPDATES
from stalebench.algorithms.updates import MomentumConfig, SGDConfig
from stalebench.cluster import ClusterConfig
from stalebench.engines.overlap import Layout
from stalebench.engines.rounds import round_bytes
from stalebench.runtime.compute import tensor_flops
from stalebench.runtime.link import FORWARD, LinkClock
from stalebench.runtime.network import Network
from stalebench.runtime.sim import p3_stall_s, pieces_s

TAIL = 7  # 3·N + 1 slots for N = 2


def latency_only(ms: float, n: int = 2) -> Network:
    """A ring all-reduce of any size takes 2(N − 1)·ms."""
    return Network(
        ClusterConfig(name="profile", num_workers=n, push_latency_ms=ms, pull_latency_ms=ms)
    )


def test_fifo_buckets_hold_whole_tensors_from_the_last_back_and_carry_the_tail():
    # tensors of 640, 32, 128, 4 floats, buckets closed at 131: [128 + 4] then [640 + 32]
    layout = Layout.build([640, 32, 128, 4], 2, 131, p3=False)
    assert layout.pieces == ((0, TAIL + 672), (TAIL + 672, TAIL + 804))
    assert layout.holding(1) == [0] and layout.holding(2) == [1]
    assert layout.span(0) == (0, 672)  # the tail's slots are not θ's


def test_p3_slices_cut_tensors_and_merge_small_neighbours():
    # 640 → 131 × 4 + 116; the 32 does not fit with the 116 (148 > 131); 128 + 4 = 132 does not
    layout = Layout.build([640, 32, 128, 4], 2, 131, p3=True)
    starts = [a for a, _ in layout.pieces]
    assert starts == [0, 138, 269, 400, 531, 647, 679, 807]
    assert layout.size == TAIL + 804
    # with room for both, a weight and its bias share a slice
    assert Layout.build([100, 10, 100, 10], 2, 110, p3=True).pieces == (
        (0, TAIL + 110),
        (TAIL + 110, TAIL + 220),
    )


def test_ready_times_follow_backward_from_the_output_and_the_tail_comes_last():
    layout = Layout.build([100, 100, 100], 2, 100, p3=True)
    back = 1 - FORWARD
    assert layout.ready_at() == pytest.approx([1.0, FORWARD + back * 2 / 3, FORWARD + back / 3])


def test_p3_sends_the_made_piece_nearest_the_input_first_when_the_link_frees():
    # three pieces made at 0.556, 0.778 and 1.0 steps (last, middle, first layer); each
    # all-reduce takes 2 × 250 ms. The link takes the last layer's at 0.556 (the only one
    # made), is free again at 1.056, when both others are made: P3 takes the first layer's,
    # fifo the order backward made them.
    layout = Layout.build([100, 100, 100], 2, 100, p3=True)
    slow = latency_only(250)
    assert layout.order(slow, 1.0, p3=True) == [2, 0, 1]
    assert layout.order(slow, 1.0, p3=False) == [2, 1, 0]
    # a link that is never busy sends every piece as it is made
    assert layout.order(latency_only(0), 1.0, p3=True) == [2, 1, 0]


def test_the_next_forward_waits_for_p3_slices_layer_by_layer_in_the_simulator():
    # the pieces above, a step of 1 s, each all-reduce 0.5 s, sent [2, 0, 1]: the last
    # layer's summed at 1.056, the first's (with the statistics) at 1.556, the middle one's
    # at 2.056. The next forward begins with the statistics at 1.556, runs the first layer
    # (1/9 s) to 1.667, waits for the middle one to 2.056, runs it and the last (in since
    # 1.056): ends at 2.278, 0.944 s past the step and its own forward of 1/3 s; fifo's
    # update waits for every piece, the last at 2.056: 1.056 s past the step
    layout = Layout.build([100, 100, 100], 2, 100, p3=True)
    slow, ready, bounds = latency_only(250), layout.ready_at(), list(layout.pieces)
    assert [k for _, k in layout.forward([[0], [1], [2]])] == [[0], [1], [2]]
    assert [share for share, _ in layout.forward([[0], [1], [2]])] == pytest.approx(
        [FORWARD / 3] * 3
    )
    p3 = p3_stall_s(slow, bounds, [2, 0, 1], ready, layout.forward([[0], [1], [2]]), 1.0)
    assert p3 == pytest.approx(1.5 + 5 / 9 + 2 / 9 - 1.0 - FORWARD)
    assert pieces_s(slow, bounds, [2, 1, 0], ready, 1.0) == pytest.approx(1.5 + 5 / 9 - 1.0)
    # a link that is never busy: every piece is in before the forward reaches its layer
    free = latency_only(0)
    assert p3_stall_s(free, bounds, [2, 1, 0], ready, layout.forward([[0], [1], [2]]), 1.0) == 0.0
    # tensors 0 and 1 one module (a layer's weight and bias): it waits for both pieces
    # before it runs (to 2.056), then its 2/9 s and the last tensor's 1/9: 1.056 s past
    # the step and the forward
    module = layout.forward([[0, 1], [2]])
    assert [k for _, k in module] == [[0, 1], [2]]
    assert p3_stall_s(slow, bounds, [2, 0, 1], ready, module, 1.0) == pytest.approx(1.5 + 5 / 9 - 1)


@pytest.mark.parametrize(
    "cfg",
    [
        SGDConfig(name="sgd", lr=0.1, weight_decay=0.01),
        MomentumConfig(name="momentum", lr=0.1, momentum=0.9),
        MomentumConfig(name="momentum", lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    ],
    ids=["sgd+wd", "momentum", "nesterov+wd"],
)
def test_a_round_applied_in_parts_equals_the_whole_step_bit_for_bit(cfg):
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(1003, generator=gen)
    whole, parts = UPDATES.build(cfg, theta, 2), UPDATES.build(cfg, theta, 2)
    a, b = theta.clone(), theta.clone()
    for _ in range(3):
        grad = torch.randn(1003, generator=gen)
        whole.step(a, grad, -1, 0)
        for lo, hi in [(500, 1003), (0, 7), (7, 500)]:  # any order, odd sizes
            parts.apply_part(b, grad, lo, hi)
        parts.count()
        assert torch.equal(a, b)
    assert parts.updates == whole.updates == 3


def test_a_rule_that_is_not_element_wise_refuses_parts():
    cfg = UPDATES.get("dc_asgd")[1](name="dc_asgd", lr=0.1)
    rule = UPDATES.build(cfg, torch.zeros(4), 2)
    with pytest.raises(TypeError, match="not element-wise"):
        rule.apply_part(torch.zeros(4), torch.ones(4), 0, 2)


def test_the_link_carries_one_collective_at_a_time():
    clock = LinkClock(latency_only(50))  # 100 ms per all-reduce
    now = time.perf_counter()
    first, second = clock.issue(4), clock.issue(4)  # the second queues behind the first
    assert first == pytest.approx(now + 0.1, abs=0.01)
    assert second == pytest.approx(first + 0.1, abs=1e-9)


def buckets_s(profile: Network, sizes: list[int], bucket_mb: float, step_s: float) -> float:
    """What the simulator's round of fifo buckets of `bucket_mb` lasts past its step."""
    layout = Layout.build(sizes, 2, max(1, int(bucket_mb * 2**20 / 4)), p3=False)
    order = layout.order(profile, 1.0, p3=False)
    return pieces_s(profile, layout.pieces, order, layout.ready_at(), step_s)


def test_the_simulated_buckets_end_when_the_last_is_through():
    # the three pieces above as fifo buckets, made at 0.556, 0.778, 1.0 of a 1 s step,
    # 0.5 s each: the link ends at 1.056, 1.556, 2.056; the push is what follows the step
    net = latency_only(250)
    assert len(Layout.build([100, 100, 100], 2, 100, p3=False).pieces) == 3
    assert buckets_s(net, [100, 100, 100], 400 / 2**20, 1.0) == pytest.approx(
        FORWARD + (1 - FORWARD) / 3 + 1.5 - 1.0
    )
    # one bucket: the one-message round's all-reduce (gradient and tail) after the whole step
    message = round_bytes(300, 2)
    assert buckets_s(net, [100, 100, 100], 1, 1.0) == pytest.approx(net.allreduce_s(message))


class ConvThenLinear(torch.nn.Module):
    """A convolution that holds few parameters and most of the FLOPs, then a linear layer
    that holds most of the parameters and few of the FLOPs (VGG's shape in small)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16 * 16 * 16, 10)

    def forward(self, x):
        return self.fc(self.conv(x).flatten(1))


def test_a_tensors_work_is_its_layers_flops_not_its_size():
    net = ConvThenLinear()
    params = list(net.parameters())  # conv.weight, conv.bias, fc.weight, fc.bias
    work = tensor_flops(net, params, torch.zeros(4, 3, 16, 16))
    conv = 2 * 4 * 16 * 16 * 16 * 3 * 9  # FLOPs (2 a multiply-add) over a batch of 4
    fc = 2 * 4 * 16 * 16 * 16 * 10
    assert sum(work[:2]) == pytest.approx(conv) and sum(work[2:]) == pytest.approx(fc)
    assert work[0] / work[1] == pytest.approx(16 * 3 * 9 / 16)  # a layer's split by size
    # by size the linear layer is 98.9 % of the step; by its FLOPs, 27 %
    assert (
        sum(work[2:]) / sum(work)
        == pytest.approx(fc / (conv + fc))
        == pytest.approx(0.27, abs=0.01)
    )
    assert sum(p.numel() for p in params[2:]) / sum(p.numel() for p in params) > 0.98
    # the real parameters are left as they were, and nothing is computed on them
    assert all(not p.is_meta for p in net.parameters())


def test_a_model_whose_operations_have_no_flop_count_is_timed_by_size():
    net = torch.nn.Sequential(torch.nn.Embedding(10, 4))
    params = list(net.parameters())
    assert tensor_flops(net, params, torch.zeros(2, 3, dtype=torch.long)) == [40.0]


def test_backward_and_the_next_forward_follow_the_work_not_the_sizes():
    # 3 tensors of equal size; the first does 6 parts of the work, the others 1 and 1
    layout = Layout.build([100, 100, 100], 2, 100, p3=True, work=[6.0, 1.0, 1.0])
    back = 1 - FORWARD
    # backward makes tensor 2 first (1/8 of it), tensor 1 next, tensor 0 last
    assert layout.ready_at() == pytest.approx([1.0, FORWARD + back * 2 / 8, FORWARD + back / 8])
    assert [s for s, _ in layout.forward([[0], [1], [2]])] == pytest.approx(
        [FORWARD * 6 / 8, FORWARD / 8, FORWARD / 8]
    )


@pytest.mark.parametrize("sizes", [[640, 32, 128, 4], [100, 10, 100, 10, 50000, 7]])
@pytest.mark.parametrize("ms", [0.0, 2.0, 250.0])
def test_a_forward_that_waits_layer_by_layer_for_fifo_pieces_waits_as_fifo_does(sizes, ms):
    """MXNet's baseline (P3's): one piece a tensor, sent as backward makes them; the next
    forward pass takes each layer once its piece is in. On one FIFO link the first layer's
    piece is made last and so sent last: the forward pass waits for it exactly as long as
    the fifo round waits for all its pieces, and then never again."""
    net = Network(
        ClusterConfig(name="p", num_workers=2, push_latency_ms=ms, pull_latency_ms=ms,
                      push_bandwidth_gbps=0.01, pull_bandwidth_gbps=0.01)
    )  # fmt: skip
    work = [float(s * (i + 1)) for i, s in enumerate(sizes)]
    layout = Layout.build(sizes, 2, 1, p3=False, work=work)
    assert len(layout.pieces) == len(sizes)  # one a tensor
    order, ready = layout.order(net, 1.0, p3=False), layout.ready_at()
    forward = layout.forward([[i] for i in range(len(sizes))])
    layerwise = p3_stall_s(net, list(layout.pieces), order, ready, forward, 0.5)
    assert layerwise == pieces_s(net, list(layout.pieces), order, ready, 0.5) > 0


class NoMetaKernel(torch.nn.Linear):
    """A layer whose forward cannot run on the meta device (a plugin's own operation)."""

    def forward(self, x):
        if x.is_meta:
            raise NotImplementedError("no meta kernel")
        return super().forward(x)


def test_a_model_that_cannot_run_on_meta_is_timed_by_size_and_says_so(caplog):
    net = torch.nn.Sequential(NoMetaKernel(4, 3))
    params = list(net.parameters())
    with caplog.at_level("WARNING", logger="stalebench"):
        assert tensor_flops(net, params, torch.zeros(2, 4)) == [12.0, 3.0]
    assert "could not be counted on the meta device (NotImplementedError" in caplog.text
