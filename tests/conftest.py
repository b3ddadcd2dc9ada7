"""Shared fixtures: small synthetic parallel corpora written into tmp_path."""

from __future__ import annotations

import gzip
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

# Syllables of a toy language: enough structure for sentencepiece to learn merges.
_SYLLABLES = ["ka", "lo", "mi", "nu", "pe", "ra", "si", "to", "ve", "zu", "bar", "den", "fol"]


def make_words(rng: random.Random, count: int) -> list[str]:
    """A vocabulary of `count` distinct toy words built from syllables."""
    words: set[str] = set()
    while len(words) < count:
        words.add("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))))
    return sorted(words)


def make_pairs(
    rng: random.Random, count: int, *, min_words: int = 3, max_words: int = 12
) -> list[tuple[str, str]]:
    """Sentence pairs whose target is the source's words reversed and upper-cased.

    Both sides have the same words, so with a joint model they have the same number of
    pieces: no pair of these trips the length-ratio filter.
    """
    words = make_words(rng, 60)
    pairs = []
    for _ in range(count):
        sentence = [rng.choice(words) for _ in range(rng.randint(min_words, max_words))]
        pairs.append((" ".join(sentence), " ".join(reversed(sentence))))
    return pairs


def write_lines(path: Path, lines: Sequence[str]) -> Path:
    """Writes one line per entry, UTF-8, gzip-compressed when the name ends in .gz."""
    data = "".join(f"{line}\n" for line in lines).encode("utf-8")
    if path.suffix == ".gz":
        # mtime=0: identical content gives identical bytes, hence identical checksums.
        with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as file:
            file.write(data)
    else:
        path.write_bytes(data)
    return path


WriteParallel = Callable[..., tuple[Path, Path]]


@pytest.fixture
def write_parallel(tmp_path: Path) -> WriteParallel:
    """Returns write(name, pairs, *, suffix="") -> (src_path, tgt_path) under tmp_path/corpus."""
    directory = tmp_path / "corpus"
    directory.mkdir(exist_ok=True)

    def write(
        name: str, pairs: Sequence[tuple[str, str]], *, suffix: str = ""
    ) -> tuple[Path, Path]:
        src = write_lines(directory / f"{name}.src{suffix}", [src for src, _ in pairs])
        tgt = write_lines(directory / f"{name}.tgt{suffix}", [tgt for _, tgt in pairs])
        return src, tgt

    return write


@pytest.fixture
def small_corpus(write_parallel: WriteParallel) -> dict[str, tuple[Path, Path]]:
    """train (400 pairs, gzip), valid (60) and test (50) splits of the toy language."""
    rng = random.Random(1234)
    return {
        "train": write_parallel("train", make_pairs(rng, 400), suffix=".gz"),
        "valid": write_parallel("valid", make_pairs(rng, 60)),
        "test": write_parallel("test", make_pairs(rng, 50)),
    }


@pytest.fixture
def toy_pairs() -> Callable[..., list[tuple[str, str]]]:
    """Returns pairs(seed, count, **options): `make_pairs` with a fresh seeded generator."""

    def pairs(seed: int, count: int, **options: int) -> list[tuple[str, str]]:
        return make_pairs(random.Random(seed), count, **options)

    return pairs


@pytest.fixture(autouse=True)
def one_thread():
    """Run each test on one thread: its models are tiny and the machine's cores are shared."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
