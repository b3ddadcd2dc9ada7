"""Scale test of the data stage: a large synthetic parallel corpus through `prepare_data`.

Generates N sentence pairs (default 1,000,000) of a made-up language, streamed to gzip files,
runs the full data stage on them (tokenizer training, filtering, encoding to memory-mapped
arrays) and prints the summary, the time taken and the peak memory of the process.

The source language has a Zipf-distributed vocabulary of syllable words; the "translation"
maps every word through a fixed syllable cipher and reverses the word order, so sentencepiece
finds real structure on both sides. A few pairs are deliberately broken (empty, overlong,
badly length-mismatched) so the filters have something to count.

Usage:
    .venv/bin/python -m benchmarks.prepare_synthetic [--pairs N] [--dir DIR] [--keep]

Peak memory is read from resource.getrusage (ru_maxrss). For an independent measurement run
it under GNU time and read "Maximum resident set size":
    /usr/bin/time -v .venv/bin/python -m benchmarks.prepare_synthetic
"""

from __future__ import annotations

import argparse
import gzip
import logging
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from seq2seq.data.prepare import prepare_data
from seq2seq.data.settings import FilterSettings, TokenizerSettings

SYLLABLES = [
    consonant + vowel
    for consonant in ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z")
    for vowel in ("a", "e", "i", "o", "u")
]
GENERATION_CHUNK = 50_000


def make_lexicon(rng: np.random.Generator, size: int) -> tuple[list[str], list[str]]:
    """Source words and their target translations (same index), all distinct."""
    cipher = dict(zip(SYLLABLES, rng.permutation(SYLLABLES).tolist(), strict=True))
    source: list[str] = []
    seen: set[str] = set()
    while len(source) < size:
        syllables = rng.choice(SYLLABLES, size=int(rng.integers(1, 5))).tolist()
        word = "".join(syllables)
        if word not in seen:
            seen.add(word)
            source.append(word)
    # Target word: ciphered syllables in reverse order, plus a marker suffix on long words.
    target = []
    for word in source:
        syllables = [word[i : i + 2] for i in range(0, len(word), 2)]
        translated = "".join(cipher[s] for s in reversed(syllables))
        target.append(translated + ("x" if len(syllables) > 2 else ""))
    return source, target


def write_corpus(
    *,
    directory: Path,
    name: str,
    pairs: int,
    rng: np.random.Generator,
    lexicon: tuple[list[str], list[str]],
) -> tuple[Path, Path]:
    """Streams `pairs` synthetic pairs to <name>.src.gz / <name>.tgt.gz in chunks."""
    source_words, target_words = lexicon
    lexicon_size = len(source_words)
    source_array = np.array(source_words, dtype=object)
    target_array = np.array(target_words, dtype=object)
    ranks = np.arange(1, lexicon_size + 1, dtype=np.float64)
    probabilities = 1.0 / ranks**1.05
    probabilities /= probabilities.sum()
    src_path = directory / f"{name}.src.gz"
    tgt_path = directory / f"{name}.tgt.gz"
    with (
        gzip.open(src_path, "wt", encoding="utf-8", compresslevel=1) as src_file,
        gzip.open(tgt_path, "wt", encoding="utf-8", compresslevel=1) as tgt_file,
    ):
        for start in range(0, pairs, GENERATION_CHUNK):
            count = min(GENERATION_CHUNK, pairs - start)
            lengths = np.clip(rng.lognormal(mean=2.5, sigma=0.5, size=count), 1, 60).astype(
                np.int64
            )
            ids = rng.choice(lexicon_size, size=int(lengths.sum()), p=probabilities)
            sources = source_array[ids].tolist()
            targets = target_array[ids].tolist()
            noise = rng.random(count)
            src_lines, tgt_lines = [], []
            position = 0
            for index, length in enumerate(lengths.tolist()):
                src_sentence = " ".join(sources[position : position + length])
                tgt_sentence = " ".join(reversed(targets[position : position + length]))
                position += length
                if noise[index] < 0.001:
                    tgt_sentence = ""
                elif noise[index] < 0.002:
                    src_sentence = " ".join([src_sentence] * 12)
                elif noise[index] < 0.003:
                    tgt_sentence = " ".join([tgt_sentence] * 5)
                src_lines.append(src_sentence)
                tgt_lines.append(tgt_sentence)
            src_file.write("\n".join(src_lines) + "\n")
            tgt_file.write("\n".join(tgt_lines) + "\n")
    return src_path, tgt_path


def peak_memory_mib() -> float:
    """Peak resident memory of this process so far (Linux reports ru_maxrss in KiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=1_000_000, help="training pairs to generate")
    parser.add_argument("--valid-pairs", type=int, default=3000, help="validation (and test) pairs")
    parser.add_argument(
        "--dir", type=Path, default=None, help="work directory (default: a temporary one)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary work directory")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--model-type", choices=("bpe", "unigram"), default="bpe")
    parser.add_argument("--seed", type=int, default=1)
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s] %(message)s")

    temporary = arguments.dir is None
    work = Path(tempfile.mkdtemp(prefix="seq2seq-synthetic-")) if temporary else arguments.dir
    work.mkdir(parents=True, exist_ok=True)
    try:
        rng = np.random.default_rng(arguments.seed)
        started = time.perf_counter()
        lexicon = make_lexicon(rng, 20_000)
        sizes = {
            "train": arguments.pairs,
            "valid": arguments.valid_pairs,
            "test": arguments.valid_pairs,
        }
        files = {
            split: write_corpus(directory=work, name=split, pairs=count, rng=rng, lexicon=lexicon)
            for split, count in sizes.items()
        }
        generated = time.perf_counter() - started
        corpus_mib = sum(path.stat().st_size for pair in files.values() for path in pair) / 2**20
        print(
            f"generated {arguments.pairs:,} training pairs in {generated:.1f} s ({corpus_mib:.0f} MiB gzip) in {work}"
        )
        memory_before = peak_memory_mib()

        settings = {
            "files": files,
            "tokenizer": TokenizerSettings(
                model_type=arguments.model_type,
                vocab_size=arguments.vocab_size,
                seed=arguments.seed,
            ),
            "filter": FilterSettings(max_length=100, max_length_ratio=3.0),
            "cache_dir": work / "cache",
        }
        started = time.perf_counter()
        prepared = prepare_data(**settings)
        first = time.perf_counter() - started
        print(prepared.format_summary())
        started = time.perf_counter()
        cached = prepare_data(**settings)
        second = time.perf_counter() - started
        assert cached.cache_hit
        print(f"prepare_data: {first:.1f} s (build), {second:.2f} s (cache hit)")
        print(
            f"peak memory (ru_maxrss): {peak_memory_mib():.0f} MiB "
            f"(after generating the corpus: {memory_before:.0f} MiB)"
        )
    finally:
        if temporary and not arguments.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
