"""Every registered model: output shape, seeded initialisation, no buffers, bad shapes."""

from __future__ import annotations

import pytest
import torch

from stalebench.errors import ConfigError
from stalebench.models import MODELS

# token sequences in, logits per position out (sockeye_rnn: tests/unit/test_paper_models.py)
SEQUENCE = ["transformer", "sockeye_rnn"]
# (C, H, W) inputs and BatchNorm buffers: tests/unit/test_cifar_resnet.py, and the papers'
# image models in tests/unit/test_paper_models.py
IMAGES = ["resnet20", "resnet50", "vgg19", "vgg11", "overfeat_fast"]
# classifiers of flat or 1-D/2-D real-valued inputs
NAMES = [n for n in MODELS.names() if n not in SEQUENCE + IMAGES]
TWO_D = ["cnn", "logreg", "mlp"]


def build(name: str, input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
    _, config = MODELS.get(name)
    return MODELS.build(config(name=name), input_shape, num_classes)


def test_builtins_are_registered():
    assert set(TWO_D) <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_logits_shape_1d(name):
    model = build(name, (40,), 10)
    logits = model(torch.randn(5, 40))
    assert logits.shape == (5, 10)
    assert logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("name", TWO_D)
def test_logits_shape_2d(name):
    model = build(name, (28, 28), 7)
    logits = model(torch.randn(3, 28, 28))
    assert logits.shape == (3, 7)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("name", NAMES)
def test_logits_shape_single_sample(name):
    assert build(name, (40,), 4)(torch.randn(1, 40)).shape == (1, 4)


@pytest.mark.parametrize("name", NAMES)
def test_gradients_reach_every_parameter(name):
    model = build(name, (40,), 3)
    loss = torch.nn.functional.cross_entropy(model(torch.randn(6, 40)), torch.arange(6) % 3)
    loss.backward()
    params = list(model.parameters())
    assert params
    assert all(p.grad is not None and p.grad.shape == p.shape for p in params)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("input_shape", [(40,), (28, 28)], ids=["1d", "2d"])
def test_same_seed_same_parameters(name, input_shape):
    if len(input_shape) == 2 and name not in TWO_D:
        pytest.skip(f"{name} is not declared to support 2-D inputs")
    torch.manual_seed(123)
    a = build(name, input_shape, 5)
    torch.manual_seed(123)
    b = build(name, input_shape, 5)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key
    torch.manual_seed(124)
    c = build(name, input_shape, 5)
    assert any(not torch.equal(sa[k], v) for k, v in c.state_dict().items())


@pytest.mark.parametrize("name", NAMES)
def test_no_buffers(name):
    for input_shape in [(40,)] + ([(28, 28)] if name in TWO_D else []):
        model = build(name, input_shape, 10)
        assert list(model.named_buffers()) == []


def test_logreg_is_one_linear_layer():
    model = build("logreg", (28, 28), 10)
    shapes = sorted(tuple(p.shape) for p in model.parameters())
    assert shapes == [(10,), (10, 784)]


@pytest.mark.parametrize("shape", [(3, 28, 28), (1, 2, 3, 4), ()])
def test_cnn_rejects_other_ranks(shape):
    with pytest.raises(ConfigError, match="model=cnn"):
        build("cnn", shape, 10)


def test_transformer_gives_logits_per_position_and_is_causal():
    torch.manual_seed(0)
    model = build("transformer", (12,), 9)
    ids = torch.randint(0, 9, (3, 12))
    logits = model(ids)
    assert logits.shape == (3, 12, 9)
    changed = ids.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 9  # a later token cannot change earlier logits
    after = model(changed)
    torch.testing.assert_close(after[:, :7], logits[:, :7])
    assert not torch.allclose(after[:, 7:], logits[:, 7:])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    assert list(model.named_buffers()) == []


@pytest.mark.parametrize("key, value", [("heads", 3), ("layers", 0)])
def test_transformer_rejects_bad_shapes(key, value):
    from stalebench.models import TransformerConfig

    with pytest.raises(ConfigError, match=f"model.{key}"):
        TransformerConfig(name="transformer", **{key: value})
