"""Character-level language modelling on a local text file or a generated corpus."""

from __future__ import annotations

import bisect
import dataclasses
import functools
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from stalebench.data.base import DATASETS, Dataset, DatasetConfig, Splits
from stalebench.errors import ConfigError

if TYPE_CHECKING:
    import torch


@dataclasses.dataclass
class CharsConfig(DatasetConfig):
    # a UTF-8 text file (e.g. tiny-Shakespeare's input.txt); empty = the generated corpus
    path: str = ""
    context: int = 64  # characters per sequence; the model predicts each next character
    val_fraction: float = 0.1  # the file's tail, held out for validation
    corpus_chars: int = 400_000  # generated corpus: its length
    corpus_words: int = 400  # generated corpus: distinct words
    corpus_branching: int = 4  # generated corpus: the words that may follow each word
    data_seed: int = 0  # generated corpus: its seed (fixed across run seeds)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.context < 2:
            raise ConfigError(f"dataset.context must be >= 2, got {self.context}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"dataset.val_fraction must be in (0, 1), got {self.val_fraction}")
        if self.corpus_chars < 1000:
            raise ConfigError(f"dataset.corpus_chars must be >= 1000, got {self.corpus_chars}")
        self.at_least_one("corpus_words", "corpus_branching")


@functools.lru_cache(maxsize=4)  # every process builds its splits more than once
def generated_corpus(num_chars: int, seed: int, num_words: int = 120, branching: int = 4) -> str:
    """A seeded source with structure at two scales: `num_words` random words spelled from
    26 letters, strung by a sparse first-order Markov chain over words (each word is followed
    by one of `branching` others, with Dirichlet weights), in sentences of 4-12 words. A
    character model first learns the spelling, then the word transitions; more words and
    branches make a task that takes longer to learn."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, size=rng.integers(2, 8))) for _ in range(num_words)]
    successors = rng.integers(0, len(words), size=(len(words), branching))
    weights = rng.dirichlet(np.ones(branching), size=len(words))
    # rng.choice(branching, p=weights[w]) as numpy draws it (one uniform against the
    # normalised cumulative weights), without its per-call checks: the same stream, faster
    cdf = weights.cumsum(axis=1)
    cdf /= cdf[:, -1:]
    cdf_rows, succ_rows = cdf.tolist(), successors.tolist()
    out, size, w = [], 0, int(rng.integers(len(words)))
    while size < num_chars:
        sentence = []
        for _ in range(int(rng.integers(4, 13))):
            sentence.append(words[w])
            w = succ_rows[w][bisect.bisect_right(cdf_rows[w], rng.random())]
        text = " ".join(sentence).capitalize() + ". "
        out.append(text)
        size += len(text)
    return "".join(out)[:num_chars]


@DATASETS.register("chars", CharsConfig)
class Chars(Dataset):
    """Character-level language modelling: the text (a local file, or the generated corpus)
    cut into non-overlapping sequences of `context` + 1 characters; x is a sequence, y the
    same shifted by one. The last `val_fraction` of the text is the validation split."""

    def text(self) -> str:
        c = self.cfg
        if not c.path:
            return generated_corpus(c.corpus_chars, c.data_seed, c.corpus_words, c.corpus_branching)
        path = Path(c.path).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"dataset.path: cannot read text file {str(path)!r}: {exc}") from exc
        return text

    def prepare(self) -> None:
        text, c = self.text(), self.cfg
        if len(set(text)) < 2:
            symbols = "no symbol" if not text else f"one distinct symbol ({text[0]!r})"
            raise ConfigError(
                f"dataset.path={c.path!r}: the corpus has {symbols} in {len(text)} characters: "
                "there is no next character to predict (a language model needs at least two)"
            )
        need = 2 * (c.context + 1)
        if min(len(text) * c.val_fraction, len(text) * (1 - c.val_fraction)) < need:
            raise ConfigError(
                f"dataset.path: {c.path or 'the generated corpus'} has {len(text)} characters; "
                f"each split needs at least {need} (2 sequences of dataset.context + 1)"
            )

    def load(self) -> Splits:
        import torch

        text, c = self.text(), self.cfg
        chars = sorted(set(text))
        lookup = {ch: i for i, ch in enumerate(chars)}
        ids = torch.tensor([lookup[ch] for ch in text], dtype=torch.int64)
        cut = int(len(ids) * (1 - c.val_fraction))

        def windows(part: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            n = (len(part) - 1) // c.context
            x = part[: n * c.context].view(n, c.context)
            y = part[1 : n * c.context + 1].view(n, c.context)
            return x, y

        return Splits(*windows(ids[:cut]), *windows(ids[cut:]), vocab=len(chars))
