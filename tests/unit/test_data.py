"""Datasets: the MNIST IDX reader on tiny hand-written files, the seeded synthetic
generator, and worker sharding (disjoint shards, per-epoch coverage, determinism)."""

from __future__ import annotations

import gzip
import struct
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
import torch

from stalebench.data import (
    MNIST,
    MNIST_FILES,
    MNISTConfig,
    Splits,
    Synthetic,
    SyntheticConfig,
    shard_batches,
)
from stalebench.errors import ConfigError

# --------------------------------------------------------------------------- MNIST (IDX)


def idx_bytes(array: np.ndarray) -> bytes:
    """LeCun's IDX encoding: 0, 0, 0x08 (unsigned byte), ndim, big-endian uint32 dims, data."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.tobytes()


def write_idx(path: Path, array: np.ndarray, gz: bool) -> Path:
    data = idx_bytes(array)
    if gz:
        path = path.with_name(path.name + ".gz")
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


@pytest.fixture
def raw_mnist() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    x_train = rng.integers(0, 256, size=(6, 4, 4), dtype=np.uint8)
    x_train[0, 0, 0], x_train[0, 0, 1] = 0, 255  # the extremes of the scale
    return {
        "x_train": x_train,
        "y_train": np.array([0, 1, 2, 3, 4, 9], dtype=np.uint8),
        "x_test": rng.integers(0, 256, size=(3, 4, 4), dtype=np.uint8),
        "y_test": np.array([5, 0, 7], dtype=np.uint8),
    }


def write_mnist(root: Path, raw: dict[str, np.ndarray], gz: bool) -> dict[str, Path]:
    root.mkdir(parents=True, exist_ok=True)
    return {key: write_idx(root / name, raw[key], gz) for key, name in MNIST_FILES.items()}


def standardised(a: np.ndarray) -> torch.Tensor:
    return torch.as_tensor((a.astype(np.float32) / 255.0 - 0.1307) / 0.3081)


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
def test_mnist_reads_idx_files(tmp_path, raw_mnist, gz):
    write_mnist(tmp_path, raw_mnist, gz)
    splits = MNIST(MNISTConfig(name="mnist", root=str(tmp_path))).load()

    assert splits.x_train.shape == (6, 4, 4) and splits.x_test.shape == (3, 4, 4)
    assert splits.y_train.shape == (6,) and splits.y_test.shape == (3,)
    assert splits.x_train.dtype == torch.float32 and splits.y_train.dtype == torch.int64
    assert splits.y_train.tolist() == [0, 1, 2, 3, 4, 9]
    assert splits.y_test.tolist() == [5, 0, 7]
    torch.testing.assert_close(splits.x_train, standardised(raw_mnist["x_train"]))
    torch.testing.assert_close(splits.x_test, standardised(raw_mnist["x_test"]))
    # pixel 0 -> -0.1307/0.3081, pixel 255 -> (1 - 0.1307)/0.3081
    assert splits.x_train[0, 0, 0].item() == pytest.approx(-0.1307 / 0.3081, rel=1e-6)
    assert splits.x_train[0, 0, 1].item() == pytest.approx((1 - 0.1307) / 0.3081, rel=1e-6)
    assert splits.input_shape == (4, 4)
    assert splits.num_classes == 10


def test_mnist_mixed_plain_and_gz(tmp_path, raw_mnist):
    for i, (key, name) in enumerate(MNIST_FILES.items()):
        write_idx(tmp_path / name, raw_mnist[key], gz=i % 2 == 1)
    splits = MNIST(MNISTConfig(name="mnist", root=str(tmp_path))).load()
    assert splits.y_train.tolist() == raw_mnist["y_train"].tolist()
    torch.testing.assert_close(splits.x_test, standardised(raw_mnist["x_test"]))


def test_mnist_missing_directory(tmp_path):
    missing = tmp_path / "nope"
    dataset = MNIST(MNISTConfig(name="mnist", root=str(missing)))
    for step in (dataset.prepare, dataset.load):
        with pytest.raises(ConfigError) as info:
            step()
        message = str(info.value)
        assert "dataset.root" in message
        assert str(missing) in message


@pytest.mark.parametrize("key", list(MNIST_FILES))
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
def test_mnist_missing_one_file(tmp_path, raw_mnist, key, gz):
    paths = write_mnist(tmp_path, raw_mnist, gz)
    paths[key].unlink()
    dataset = MNIST(MNISTConfig(name="mnist", root=str(tmp_path)))
    for step in (dataset.prepare, dataset.load):
        with pytest.raises(ConfigError) as info:
            step()
        message = str(info.value)
        assert "dataset.root" in message
        assert MNIST_FILES[key] in message
        assert str(tmp_path) in message


def test_mnist_rejects_non_idx_file(tmp_path, raw_mnist):
    paths = write_mnist(tmp_path, raw_mnist, gz=False)
    paths["y_test"].write_bytes(b"\x01\x02\x0d\x01" + struct.pack(">I", 3) + b"\x00\x01\x02")
    with pytest.raises(ConfigError, match="dataset.root"):
        MNIST(MNISTConfig(name="mnist", root=str(tmp_path))).load()


@pytest.mark.parametrize(
    "content",
    [b"", b"\x00\x00\x08\x01" + struct.pack(">I", 3) + b"\x01"],
    ids=["empty", "truncated"],
)
def test_mnist_unreadable_file_is_a_config_error(tmp_path, raw_mnist, content):
    paths = write_mnist(tmp_path, raw_mnist, gz=False)
    paths["y_test"].write_bytes(content)
    with pytest.raises(ConfigError, match="dataset.root.*t10k-labels-idx1-ubyte"):
        MNIST(MNISTConfig(name="mnist", root=str(tmp_path))).load()


def test_mnist_image_and_label_counts_must_agree(tmp_path, raw_mnist):
    raw_mnist["y_test"] = np.array([1, 2, 3, 4, 5], dtype=np.uint8)
    write_mnist(tmp_path, raw_mnist, gz=False)
    with pytest.raises(ConfigError, match="test split has 3 images but 5 labels"):
        MNIST(MNISTConfig(name="mnist", root=str(tmp_path))).load()


# --------------------------------------------------------------------------- synthetic


def synthetic(**kw) -> Splits:
    cfg = dict(num_train=60, num_test=25, num_features=7, num_classes=3)
    cfg.update(kw)
    return Synthetic(SyntheticConfig(name="synthetic", **cfg)).load()


def test_synthetic_shapes_match_config():
    s = synthetic()
    assert s.x_train.shape == (60, 7) and s.y_train.shape == (60,)
    assert s.x_test.shape == (25, 7) and s.y_test.shape == (25,)
    assert s.x_train.dtype == torch.float32 and s.y_train.dtype == torch.int64
    assert s.input_shape == (7,)
    labels = torch.cat([s.y_train, s.y_test])
    assert labels.min() >= 0 and labels.max() < 3


def test_synthetic_same_seed_is_identical():
    a, b = synthetic(data_seed=3), synthetic(data_seed=3)
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_synthetic_different_seed_differs():
    a, b = synthetic(data_seed=3), synthetic(data_seed=4)
    assert not torch.equal(a.x_train, b.x_train)
    assert not torch.equal(a.x_test, b.x_test)


def test_synthetic_rejects_bad_config():
    with pytest.raises(ConfigError, match="dataset.num_classes"):
        SyntheticConfig(name="synthetic", num_classes=1)
    with pytest.raises(ConfigError, match="dataset.batch_size"):
        SyntheticConfig(name="synthetic", batch_size=0)


# --------------------------------------------------------------------------- sharding


def indexed(n: int) -> Splits:
    """A dataset whose x is the sample's index, so a batch tells which samples it holds."""
    x = torch.arange(n, dtype=torch.float32).unsqueeze(1)
    y = torch.arange(n) % 3
    return Splits(x, y, x[:3].clone(), y[:3].clone())


def batch_indices(batch: tuple[torch.Tensor, torch.Tensor]) -> list[int]:
    x, y = batch
    idx = x[:, 0].long()
    assert torch.equal(y, idx % 3)  # labels travel with their samples
    return idx.tolist()


def shard_of(splits: Splits, worker: int, num_workers: int, seed: int) -> list[int]:
    """One epoch of batch size 1 visits the whole shard."""
    n = len(splits.y_train)
    size = len(range(worker, n, num_workers))
    batches = shard_batches(splits, worker, num_workers, batch_size=1, seed=seed)
    return [i for b in islice(batches, size) for i in batch_indices(b)]


@pytest.mark.parametrize("n, num_workers", [(24, 4), (26, 4), (7, 3), (10, 1)])
def test_shards_are_disjoint_and_cover_the_training_split(n, num_workers):
    splits = indexed(n)
    shards = [shard_of(splits, w, num_workers, seed=5) for w in range(num_workers)]
    for w, shard in enumerate(shards):
        assert len(shard) == len(set(shard)), f"worker {w} saw a sample twice in one epoch"
        assert len(shard) in (n // num_workers, -(-n // num_workers))
    for a in range(num_workers):
        for b in range(a + 1, num_workers):
            assert not set(shards[a]) & set(shards[b]), (a, b)
    assert sorted(i for shard in shards for i in shard) == list(range(n))


def test_shard_assignment_depends_on_seed():
    splits = indexed(40)
    assert shard_of(splits, 0, 4, seed=1) != shard_of(splits, 0, 4, seed=2)


def test_same_seed_gives_the_same_batch_sequence():
    splits = indexed(30)
    a = [batch_indices(b) for b in islice(shard_batches(splits, 1, 3, 4, seed=9), 12)]
    b = [batch_indices(b) for b in islice(shard_batches(splits, 1, 3, 4, seed=9), 12)]
    c = [batch_indices(b) for b in islice(shard_batches(splits, 1, 3, 4, seed=10), 12)]
    assert a == b
    assert a != c


def test_each_epoch_visits_the_shard_exactly_once():
    n, num_workers, batch_size = 48, 3, 4  # shards of 16 samples: 4 batches per epoch
    splits = indexed(n)
    per_epoch = 16 // batch_size
    for worker in range(num_workers):
        batches = shard_batches(splits, worker, num_workers, batch_size, seed=2)
        epochs = []
        for _ in range(5):
            epoch = [i for b in islice(batches, per_epoch) for i in batch_indices(b)]
            assert len(epoch) == 16 and len(set(epoch)) == 16
            epochs.append(epoch)
        assert all(sorted(e) == sorted(epochs[0]) for e in epochs), "shard changed over epochs"
        assert len({tuple(e) for e in epochs}) > 1, "epochs are not reshuffled"


def test_batches_have_the_requested_size():
    splits = indexed(50)
    for x, y in islice(shard_batches(splits, 0, 2, 7, seed=0), 10):
        assert x.shape == (7, 1) and y.shape == (7,)


def test_batch_size_larger_than_shard_raises():
    splits = indexed(20)  # 4 workers -> shards of 5
    with pytest.raises(ConfigError) as info:
        next(shard_batches(splits, 0, 4, batch_size=6, seed=0))
    assert "dataset.batch_size" in str(info.value)
    assert "6" in str(info.value)
    next(shard_batches(splits, 0, 4, batch_size=5, seed=0))  # exactly the shard is fine


# --------------------------------------------------------------------------- package layout


def test_package_reexports_each_module_and_registers_every_dataset():
    """`stalebench.data` is split into modules; the names other modules import from the
    package are the modules' own objects, and importing the package registers all six."""
    import stalebench.data as data
    from stalebench.data import base, chars, mnist, mnist1d, sharding, synthetic

    for module in (base, sharding, synthetic, mnist1d, mnist, chars):
        for name in dir(module):
            if name in data.__all__:
                assert getattr(data, name) is getattr(module, name), name
    assert data.shard_batches is sharding.shard_batches
    assert data.Splits is base.Splits and data.DATASETS is base.DATASETS
    assert set(data.DATASETS._entries) >= {
        "synthetic",
        "mnist1d",
        "mnist",
        "chars",
        "cifar10",
        "regression",
    }


# --------------------------------------------------------------------------- dirichlet


def _labels(n=6000, classes=10):
    return torch.arange(n) % classes


def _histograms(shards, classes=10):
    return torch.stack([torch.bincount(_labels()[s], minlength=classes) for s in shards]).float()


def test_dirichlet_shards_partition_the_split_and_are_seeded():
    from stalebench.data.sharding import dirichlet_shards

    shards = dirichlet_shards(_labels(), 8, 0.5, seed=3)
    every = torch.cat(shards).sort().values
    assert torch.equal(every, torch.arange(6000))  # each sample exactly once
    again = dirichlet_shards(_labels(), 8, 0.5, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(shards, again, strict=True))
    other = dirichlet_shards(_labels(), 8, 0.5, seed=4)
    assert not all(torch.equal(a, b) for a, b in zip(shards, other, strict=True))


def test_small_alpha_skews_labels_and_large_alpha_is_iid():
    from stalebench.data.sharding import dirichlet_shards

    def skew(alpha):
        h = _histograms(dirichlet_shards(_labels(), 8, alpha, seed=0))
        share = h / h.sum(1, keepdim=True)  # each worker's label distribution
        return float((share - 0.1).abs().sum(1).mean() / 2)  # mean distance from uniform

    assert skew(0.1) > 0.6  # most of a worker's samples from a few classes
    assert skew(1e6) < 0.01  # every worker ≈ the global label distribution
    h = _histograms(dirichlet_shards(_labels(), 8, 1e6, seed=0))
    assert (h.sum(1) - 750).abs().max() <= 10  # and ≈ equal shards


def test_dirichlet_needs_class_labels():
    from stalebench.data.sharding import dirichlet_shards

    with pytest.raises(ConfigError, match="dataset.sharding=dirichlet splits by class label"):
        dirichlet_shards(torch.randn(100), 4, 1.0, seed=0)


def test_the_data_is_sharded_among_the_engines_workers_not_the_clusters():
    """An engine whose compute is one process (num_workers=1) on a 4-worker cluster reads the
    whole split, not a quarter of it; with 2 it reads half."""
    from stalebench.job import Job
    from tests.conftest import compose, fast_with

    cfg = compose(fast_with(["cluster.num_workers=4", "budget.max_updates=1"]))
    n_train = len(Job.build(cfg).splits.y_train)
    assert len(Job.build(cfg, num_workers=1).batches(0).shard) == n_train
    halves = [len(Job.build(cfg, num_workers=2).batches(w).shard) for w in range(2)]
    assert sum(halves) == n_train and max(halves) - min(halves) <= 1
    assert len(Job.build(cfg).batches(3).shard) == len(range(3, n_train, 4))
