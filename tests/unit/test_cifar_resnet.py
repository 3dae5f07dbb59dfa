"""CIFAR-10 read from tiny batch files written here in the real python-pickle format (errors,
normalisation, augmentation), ResNet-20 (shape, parameter count, option-A shortcuts,
config checks), and an end-to-end simulated run of both together."""

from __future__ import annotations

import os
import pickle
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
import torch

from stalebench.data import DATASETS, shard_batches
from stalebench.data.cifar import (
    CIFAR10,
    MEAN,
    STD,
    TEST_FILE,
    TRAIN_FILES,
    CIFAR10Config,
    crop_and_flip,
)
from stalebench.errors import ConfigError
from stalebench.metrics.events import read_events
from stalebench.models import MODELS, ResNetConfig
from tests.conftest import run_job

TRAIN_PER_FILE, NUM_TEST = 20, 10
ALL_FILES = [*TRAIN_FILES, TEST_FILE]

# --------------------------------------------------------------------------- files


def write_batch(path: Path, data: np.ndarray, labels: list[int], protocol: int = 2) -> None:
    """One batch as the original files hold it: a dict with bytes keys, uint8 rows of 3,072."""
    batch = {
        b"batch_label": b"synthetic batch",
        b"labels": list(labels),
        b"data": np.ascontiguousarray(data),
        b"filenames": [f"img{i}.png".encode() for i in range(len(labels))],
    }
    with open(path, "wb") as f:
        pickle.dump(batch, f, protocol=protocol)


@pytest.fixture
def raw_cifar() -> dict[str, tuple[np.ndarray, list[int]]]:
    rng = np.random.default_rng(3)
    raw = {}
    for i, name in enumerate(ALL_FILES):
        n = NUM_TEST if name == TEST_FILE else TRAIN_PER_FILE
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = [(i + j) % 10 for j in range(n)]
        raw[name] = (data, labels)
    data = raw[TRAIN_FILES[0]][0]
    data[0, :1024], data[0, 1024:2048], data[0, 2048:] = 0, 128, 255  # red, green, blue planes
    return raw


def write_cifar(root: Path, raw, protocol: int = 2) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, (data, labels) in raw.items():
        write_batch(root / name, data, labels, protocol)
    meta = {b"label_names": [b"airplane", b"automobile"], b"num_cases_per_batch": 20}
    (root / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return root


def cifar(root: Path, **kw) -> CIFAR10:
    return CIFAR10(CIFAR10Config(name="cifar10", root=str(root), **kw))


def normalised(data: np.ndarray) -> torch.Tensor:
    x = data.reshape(-1, 3, 32, 32).astype(np.float32) / 255.0
    mean = np.array(MEAN, dtype=np.float32).reshape(1, 3, 1, 1)
    std = np.array(STD, dtype=np.float32).reshape(1, 3, 1, 1)
    return torch.as_tensor((x - mean) / std)


# --------------------------------------------------------------------------- reader


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL], ids=["py2-era", "highest"])
def test_cifar_reads_the_python_batches(tmp_path, raw_cifar, protocol):
    dataset = cifar(write_cifar(tmp_path, raw_cifar, protocol))
    dataset.prepare()
    s = dataset.load()

    assert s.x_train.shape == (5 * TRAIN_PER_FILE, 3, 32, 32)
    assert s.x_test.shape == (NUM_TEST, 3, 32, 32)
    assert s.x_train.dtype == torch.float32 and s.y_train.dtype == torch.int64
    assert s.input_shape == (3, 32, 32)
    assert s.num_classes == 10
    # the training split is the five batches in order, labels travelling with their images
    train_labels = [label for name in TRAIN_FILES for label in raw_cifar[name][1]]
    assert s.y_train.tolist() == train_labels
    assert s.y_test.tolist() == raw_cifar[TEST_FILE][1]
    train_data = np.concatenate([raw_cifar[name][0] for name in TRAIN_FILES])
    torch.testing.assert_close(s.x_train, normalised(train_data))
    torch.testing.assert_close(s.x_test, normalised(raw_cifar[TEST_FILE][0]))


def test_cifar_reads_batches_pickled_by_numpy_1(tmp_path, raw_cifar):
    # the original files name numpy.core.multiarray; numpy 2 writes numpy._core.multiarray
    root = write_cifar(tmp_path, raw_cifar)
    for name in ALL_FILES:
        raw = (root / name).read_bytes()
        assert b"numpy._core.multiarray" in raw
        (root / name).write_bytes(raw.replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))
    s = cifar(root).load()
    torch.testing.assert_close(s.x_test, normalised(raw_cifar[TEST_FILE][0]))


def test_cifar_rows_are_channel_major_and_normalised_per_channel(tmp_path, raw_cifar):
    s = cifar(write_cifar(tmp_path, raw_cifar)).load()
    first = s.x_train[0]  # red plane 0, green 128, blue 255
    for channel, pixel in enumerate((0, 128, 255)):
        expected = (pixel / 255.0 - MEAN[channel]) / STD[channel]
        torch.testing.assert_close(first[channel], torch.full((32, 32), expected))
    assert first[0, 0, 0].item() == pytest.approx(-0.4914 / 0.2470, rel=1e-6)
    assert first[2, 0, 0].item() == pytest.approx((1 - 0.4465) / 0.2616, rel=1e-6)


def test_cifar_batches_meta_is_optional(tmp_path, raw_cifar):
    root = write_cifar(tmp_path, raw_cifar)
    (root / "batches.meta").unlink()
    assert len(cifar(root).load().y_train) == 5 * TRAIN_PER_FILE


def test_cifar_missing_directory(tmp_path):
    missing = tmp_path / "cifar-10-batches-py"
    dataset = cifar(missing)
    for step in (dataset.prepare, dataset.load):
        with pytest.raises(ConfigError) as info:
            step()
        message = str(info.value)
        assert "dataset.root" in message and str(missing) in message
        assert all(name in message for name in ALL_FILES)


@pytest.mark.parametrize("name", ALL_FILES)
def test_cifar_missing_one_file(tmp_path, raw_cifar, name):
    root = write_cifar(tmp_path, raw_cifar)
    (root / name).unlink()
    dataset = cifar(root)
    for step in (dataset.prepare, dataset.load):
        with pytest.raises(ConfigError) as info:
            step()
        message = str(info.value)
        assert "dataset.root" in message and str(root) in message
        assert f"has no {name}" in message


def _evil(marker: Path) -> bytes:
    class Evil:  # unpickling this would call os.system
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    return pickle.dumps({b"data": Evil(), b"labels": []})


@pytest.mark.parametrize(
    "content",
    [
        lambda tmp: b"",
        lambda tmp: b"not a pickle at all",
        lambda tmp: pickle.dumps({b"data": np.zeros((4, 3072), np.uint8)}, protocol=2)[:-20],
        lambda tmp: pickle.dumps([1, 2, 3]),
        lambda tmp: pickle.dumps({b"labels": [0, 1]}),
        lambda tmp: _evil(tmp / "pwned"),
    ],
    ids=["empty", "garbage", "truncated", "not-a-dict", "no-data", "code"],
)
def test_cifar_unreadable_file_is_a_config_error(tmp_path, raw_cifar, content):
    root = write_cifar(tmp_path / "root", raw_cifar)
    (root / "data_batch_3").write_bytes(content(tmp_path))
    dataset = cifar(root)
    for step in (dataset.prepare, dataset.load):
        with pytest.raises(ConfigError, match=r"dataset\.root.*data_batch_3"):
            step()
    assert not (tmp_path / "pwned").exists(), "a data file ran code"


@pytest.mark.parametrize(
    "data, labels",
    [
        (np.zeros((4, 1024), np.uint8), [0, 1, 2, 3]),  # a grey-scale row
        (np.zeros((4, 3072), np.float32), [0, 1, 2, 3]),  # not bytes
        (np.zeros((4, 3072), np.uint8), [0, 1, 2]),  # a label missing
        (np.zeros((4, 3072), np.uint8), [0, 1, 2, 10]),  # not a CIFAR-10 class
    ],
    ids=["row-size", "dtype", "label-count", "label-range"],
)
def test_cifar_wrong_shapes_are_a_config_error(tmp_path, raw_cifar, data, labels):
    root = write_cifar(tmp_path, raw_cifar)
    write_batch(root / TEST_FILE, data, labels)
    with pytest.raises(ConfigError, match=r"dataset\.root.*test_batch"):
        cifar(root).prepare()


def test_cifar_is_registered_with_its_defaults():
    _, config = DATASETS.get("cifar10")
    cfg = config(name="cifar10")
    assert cfg.root == "data/cifar-10-batches-py"
    assert cfg.augment is True


# --------------------------------------------------------------------------- augmentation


def test_crop_and_flip_is_a_padded_crop_maybe_flipped():
    torch.manual_seed(0)
    x = torch.randn(64, 3, 8, 8)
    fill = torch.tensor([-1.0, -2.0, -3.0])
    out = crop_and_flip(x, torch.Generator().manual_seed(1), padding=2, fill=fill)
    assert out.shape == x.shape
    padded = fill.view(1, 3, 1, 1).expand(64, 3, 12, 12).clone()
    padded[:, :, 2:10, 2:10] = x
    seen = set()
    for i in range(len(x)):
        matches = [
            (dy, dx, flip)
            for dy in range(5)
            for dx in range(5)
            for flip in (False, True)
            if torch.equal(
                out[i], (lambda c: c.flip(2) if flip else c)(padded[i, :, dy : dy + 8, dx : dx + 8])
            )
        ]
        assert matches, f"sample {i} is not a crop of its padded image"
        seen.update(matches)
    assert {flip for _, _, flip in seen} == {False, True}
    assert len({(dy, dx) for dy, dx, _ in seen}) > 10  # offsets vary per sample


def test_padding_is_black_after_normalisation(tmp_path, raw_cifar):
    s = cifar(write_cifar(tmp_path, raw_cifar)).load()
    x = torch.full((200, 3, 32, 32), 100.0)  # no real pixel is this bright
    out = s.augment(x, torch.Generator().manual_seed(0))
    black = torch.tensor([-m / d for m, d in zip(MEAN, STD, strict=True)])
    border = out != 100.0
    assert border.any()
    for c in range(3):
        assert torch.all(out[:, c][border[:, c]] == black[c])


def first_batches(splits, seed: int, worker: int = 0, count: int = 6):
    return list(islice(shard_batches(splits, worker, 2, 8, seed), count))


def test_augmentation_is_deterministic_per_seed_and_changes_batches(tmp_path, raw_cifar):
    root = write_cifar(tmp_path, raw_cifar)
    plain = cifar(root, augment=False).load()
    augmented = cifar(root).load()
    assert plain.augment is None and augmented.augment is not None

    a, b = first_batches(augmented, seed=4), first_batches(augmented, seed=4)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    other = first_batches(augmented, seed=5)
    assert any(not torch.equal(xa, xo) for (xa, _), (xo, _) in zip(a, other, strict=True))
    other_worker = first_batches(augmented, seed=4, worker=1)
    assert all(not torch.equal(xa, xo) for (xa, _), (xo, _) in zip(a, other_worker, strict=True))

    # the same samples in the same order, only their pixels moved
    unaugmented = first_batches(plain, seed=4)
    for (xa, ya), (xp, yp) in zip(a, unaugmented, strict=True):
        assert torch.equal(ya, yp)
        assert xa.shape == xp.shape and not torch.equal(xa, xp)
    # evaluation data is never augmented
    torch.testing.assert_close(augmented.x_train, plain.x_train)
    torch.testing.assert_close(augmented.x_test, plain.x_test)


# --------------------------------------------------------------------------- ResNet-20


def resnet(input_shape=(3, 32, 32), num_classes=10, **kw) -> torch.nn.Module:
    return MODELS.build(ResNetConfig(name="resnet20", **kw), input_shape, num_classes)


def test_resnet20_logits_shape():
    torch.manual_seed(0)
    model = resnet()
    logits = model(torch.randn(4, 3, 32, 32))
    assert logits.shape == (4, 10) and torch.isfinite(logits).all()
    model.eval()  # a single image in evaluation mode
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 10)


def count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_resnet20_parameter_count():
    # by hand: stem 3·16·9 + 32; stage 1: 3 blocks of 2·(16·16·9) + 2·32; stage 2:
    # 16·32·9 + 32·32·9 + 128, then 2·(2·32·32·9 + 128); stage 3 likewise with 64; fc 64·10 + 10
    stem = 3 * 16 * 9 + 2 * 16
    stage1 = 3 * (2 * 16 * 16 * 9 + 4 * 16)
    stage2 = (16 * 32 * 9 + 32 * 32 * 9 + 4 * 32) + 2 * (2 * 32 * 32 * 9 + 4 * 32)
    stage3 = (32 * 64 * 9 + 64 * 64 * 9 + 4 * 64) + 2 * (2 * 64 * 64 * 9 + 4 * 64)
    fc = 64 * 10 + 10
    assert stem + stage1 + stage2 + stage3 + fc == 269_722
    assert count(resnet()) == 269_722  # ≈ 0.27M, He et al. 2016 Table 6
    assert count(resnet(depth=56)) == 853_018  # ≈ 0.85M, ibid.


def test_resnet20_layers_and_option_a_shortcuts():
    model = resnet()
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(convs) + len(linears) == 20  # the 20 weighted layers
    assert all(c.kernel_size == (3, 3) for c in convs)  # option A: no 1×1 projections
    assert [c.out_channels for c in convs] == [16] * 7 + [32] * 6 + [64] * 6
    assert [c.stride for c in convs if c.stride != (1, 1)] == [(2, 2), (2, 2)]
    batch_norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert len(batch_norms) == 19


def test_resnet_width_and_input_channels():
    model = resnet(input_shape=(1, 16, 16), num_classes=3, width=8)
    assert model(torch.randn(2, 1, 16, 16)).shape == (2, 3)
    assert model.head[-1].in_features == 32


def test_resnet20_gradients_reach_every_parameter():
    torch.manual_seed(0)
    model = resnet()
    loss = torch.nn.functional.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.arange(4))
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_resnet_same_seed_same_parameters():
    torch.manual_seed(7)
    a = resnet()
    torch.manual_seed(7)
    b = resnet()
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("depth", [21, 19, 2, 0, -4])
def test_resnet_depth_must_be_6n_plus_2(depth):
    with pytest.raises(ConfigError, match=rf"model\.depth.*got {depth}$"):
        ResNetConfig(name="resnet20", depth=depth)


def test_resnet_rejects_bad_width():
    with pytest.raises(ConfigError, match="model.width"):
        ResNetConfig(name="resnet20", width=0)


@pytest.mark.parametrize("shape", [(40,), (28, 28), (1, 3, 32, 32)])
def test_resnet_needs_images(shape):
    with pytest.raises(ConfigError, match=r"model=resnet20 needs images"):
        resnet(input_shape=shape)


# --------------------------------------------------------------------------- end to end


def sim_run(run_dir: Path, root: Path, *overrides: str) -> tuple[dict, list[dict]]:
    result = run_job(
        run_dir,
        [
            "runtime=sim",
            "dataset=cifar10",
            f"dataset.root='{root}'",
            "dataset.batch_size=8",
            "model=resnet20",
            "cluster.num_workers=2",
            "budget.max_updates=4",
            "eval.every_updates=2",
            "eval.train_samples=16",
            *overrides,
        ],
    )
    return result.summary, result.events


def test_sim_run_trains_resnet20_on_cifar10_deterministically(tmp_path, raw_cifar):
    root = write_cifar(tmp_path / "cifar", raw_cifar)
    summary, events = sim_run(tmp_path / "a", root)
    assert summary["status"] == "completed", summary["error"]
    assert summary["model"] == "resnet20" and summary["dataset"] == "cifar10"
    assert summary["updates"] == 4
    evals = [e for e in events if e["kind"] == "eval" and e["split"] == "test"]
    assert evals and all(0.0 <= e["accuracy"] <= 1.0 for e in evals)
    sim_run(tmp_path / "b", root)
    same = (tmp_path / "a" / "events.jsonl").read_bytes() == (
        tmp_path / "b" / "events.jsonl"
    ).read_bytes()
    assert same, "the same seed gave different events"
    sim_run(tmp_path / "c", root, "dataset.augment=false")
    losses = lambda d: [e["loss"] for e in read_events(d / "events.jsonl") if e["kind"] == "update"]  # noqa: E731
    assert losses(tmp_path / "a") != losses(tmp_path / "c"), "augmentation changed nothing"


def test_run_with_a_missing_cifar_root_fails_before_starting(tmp_path):
    with pytest.raises(ConfigError, match="dataset.root"):
        sim_run(tmp_path / "run", tmp_path / "nowhere")
    assert not (tmp_path / "run").exists()
