"""Every model × dataset pair of the registries either trains a step or is refused by name
before any process starts (`experiment.prepare`), and data no run can learn from is refused
by name too: a corpus of fewer than two distinct symbols, regression targets without
variance, a class with no example in the split a run evaluates. Files are made here, small,
in the datasets' real formats (IDX for MNIST, the python batches for CIFAR-10)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from stalebench import experiment
from stalebench.data import DATASETS
from stalebench.data.base import Splits
from stalebench.errors import ConfigError
from stalebench.job import Job
from stalebench.models import MODELS
from stalebench.runtime.record import Into, gradient
from tests.conftest import compose
from tests.unit.test_cifar_resnet import ALL_FILES, NUM_TEST, TEST_FILE, write_cifar
from tests.unit.test_data import write_mnist
from tests.unit.test_paper_models import PAPER

SMALL = {  # each dataset at a size that loads in milliseconds
    "synthetic": ["dataset.num_train=200", "dataset.num_test=100"],
    "regression": ["dataset.num_train=200", "dataset.num_test=100"],
    "chars": ["dataset.corpus_chars=4000", "dataset.context=16"],
    "mnist1d": ["dataset.num_samples=400"],
    "mnist": ["dataset.root={tmp}/mnist"],
    "cifar10": ["dataset.root={tmp}/cifar"],
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    labels = lambda n: np.arange(n) % 10  # noqa: E731  every class in every split
    write_mnist(
        tmp / "mnist",
        {
            "x_train": rng.integers(0, 256, size=(60, 28, 28), dtype=np.uint8),
            "y_train": labels(60).astype(np.uint8),
            "x_test": rng.integers(0, 256, size=(20, 28, 28), dtype=np.uint8),
            "y_test": labels(20).astype(np.uint8),
        },
        gz=False,
    )
    raw = {}
    for name in ALL_FILES:
        n = NUM_TEST if name == TEST_FILE else 20
        raw[name] = (rng.integers(0, 256, size=(n, 3072), dtype=np.uint8), labels(n).tolist())
    write_cifar(tmp / "cifar", raw)
    return tmp


def overrides(model: str, dataset: str, tmp) -> list[str]:
    small = [o.format(tmp=tmp) for o in SMALL[dataset]]
    return ["runtime=sim", f"model={model}", f"dataset={dataset}", *small, "eval.train_samples=0"]


# shapes without values train nothing: they run cost-only (tests/integration/test_cost_only.py)
VALUELESS = {"shape"}


def test_every_dataset_of_the_registry_has_a_small_form_here():
    # a new dataset is added to the pairs below
    assert set(SMALL) | VALUELESS == set(DATASETS.names())


# the papers' networks at their published sizes (up to 144M parameters, ~30 s a pair on
# the CPU) are built on the meta device at their papers' shapes, and refused on inputs they
# cannot take, in tests/unit/test_paper_models.py
SMALL_MODELS = sorted(n for n in MODELS.names() if n not in PAPER)


@pytest.mark.parametrize("dataset", sorted(SMALL))
@pytest.mark.parametrize("model", SMALL_MODELS)
def test_each_pair_trains_a_step_or_is_refused_by_name(files, model, dataset, tmp_path):
    cfg = compose(overrides(model, dataset, files))
    cfg.run_dir = str(tmp_path)
    try:
        engine = experiment.prepare(cfg)
    except ConfigError as exc:
        assert f"model={model}" in str(exc), str(exc)  # the key and its value
        return
    job = Job.build(cfg, engine.num_workers)
    net = MODELS.build(cfg.model, job.splits.input_shape, job.splits.num_classes)
    params, batch, cpu = list(net.parameters()), next(job.batches(0)), torch.device("cpu")
    torch.manual_seed(0)  # a model's dropout draws the same in each call
    grad, loss = gradient(net, params, batch, cpu)
    assert math.isfinite(loss) and torch.isfinite(grad).all() and grad.abs().sum() > 0
    # the same gradient written into a message: concatenated, and copied into views (Into)
    for out in (torch.empty_like(grad), Into(torch.empty_like(grad), params)):
        torch.manual_seed(0)
        again, loss_again = gradient(net, params, batch, cpu, out)
        assert torch.equal(again, grad) and loss_again == loss
        assert again.data_ptr() == (out.flat if isinstance(out, Into) else out).data_ptr()


def test_the_pairs_refused_are_the_ones_that_cannot_meet(files):
    refused = set()
    for model in SMALL_MODELS:
        for dataset in SMALL:
            try:
                experiment.prepare(compose(overrides(model, dataset, files)))
            except ConfigError:
                refused.add((model, dataset))
    # a language model takes token ids, the rest take features; ResNet-20 images only
    assert ("transformer", "mnist1d") in refused and ("transformer", "chars") not in refused
    assert ("mlp", "chars") in refused and ("resnet20", "cifar10") not in refused
    assert ("mlp", "mnist") not in refused and ("cnn", "mnist1d") not in refused


def test_the_default_dataset_with_a_language_model_is_refused_with_torchs_reason():
    with pytest.raises(ConfigError) as refused:
        experiment.prepare(compose(["runtime=sim", "model=transformer"]))
    message = str(refused.value)
    assert message.startswith("model=transformer cannot train on dataset=mnist1d")
    assert "inputs float32 of shape (40,)" in message and "Long" in message


@pytest.mark.parametrize("text", ["\0" * 20_000, "", "aaaa" * 500])
def test_a_corpus_of_fewer_than_two_symbols_is_refused(tmp_path, text):
    path = tmp_path / "corpus.txt"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"dataset.path='{path}': the corpus has"):
        experiment.prepare(compose(["runtime=sim", "algorithm=pipedream", f"dataset.path={path}"]))


def test_regression_targets_without_variance_are_refused():
    # no registered generator makes them (w* has a non-zero entry): a plugin's data could;
    # prepare() runs this check on every run's splits (the class check below goes through it)
    x = torch.randn(100, 4, generator=torch.Generator().manual_seed(0))
    flat = Splits(x, torch.full((100,), 0.5), x[:20], torch.full((20,), 0.5))
    with pytest.raises(ConfigError, match=r"dataset=flat: every training target is \[0.5\]"):
        flat.check("dataset=flat")
    varied = dataclasses.replace(flat, y_train=flat.y_train + torch.arange(100) * 1e-3)
    varied.check("dataset=flat")  # one target apart is enough


def test_a_class_missing_from_the_evaluated_split_is_refused():
    # 4 test examples cannot hold 10 classes: the accuracy could never count 6 of them
    cfg = ["runtime=sim", "dataset=synthetic", "dataset.num_classes=10", "dataset.num_test=4"]
    with pytest.raises(ConfigError, match=r"dataset=synthetic: 6 of its 10 classes .* test split"):
        experiment.prepare(compose(cfg))
    # held out of training instead (eval.split=val): the validation split is the one checked
    cfg = ["runtime=sim", "dataset=synthetic", "dataset.num_classes=10", "dataset.num_train=40"]
    with pytest.raises(ConfigError, match=r"no example in the val split of 4 examples"):
        experiment.prepare(compose([*cfg, "eval.split=val"]))
