"""``seq2seq-build-shortlist checkpoint=PATH src=FILE tgt=FILE output=PATH``: build an
output-vocabulary shortlist for a checkpoint from its training pairs.

How it is built and what it prints, with examples: docs/evaluate-translate.md,
"Output-vocabulary shortlists" (and :mod:`seq2seq.inference.shortlist`). Exit status 1 with a
one-line ``error: ...`` on a bad checkpoint, a missing or unreadable file, or files of different
lengths. The previous release's ``--checkpoint``, ``--src``, ... flags still work, with a
warning.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from seq2seq.checkpoint import CheckpointError, load_checkpoint, tokenizers_from_payload
from seq2seq.cli.app import hydra_tool
from seq2seq.cli.common import check_types, fail
from seq2seq.data.text_files import DataError, read_lines
from seq2seq.inference.shortlist import (
    Shortlist,
    ShortlistError,
    same_pieces,
    vocabulary_fingerprint,
)

ENCODE_CHUNK = 10_000  # sentences per sentencepiece call


def encode(tokenizer, lines: list[str]) -> list[list[int]]:
    ids: list[list[int]] = []
    for start in range(0, len(lines), ENCODE_CHUNK):
        ids.extend(tokenizer.encode(lines[start: start + ENCODE_CHUNK]))
    return ids


def size_report(shortlist: Shortlist, sources: list[list[int]], batch: int, seed: int = 0) -> str:
    """Mean shortlist size for single sentences and for random batches of ``batch`` sentences."""
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(sources), size=min(len(sources), 1000), replace=False)
    single = np.mean([shortlist.for_sources([sources[i]]).numel() for i in picked[:200]])
    batches = [
        shortlist.for_sources([sources[i] for i in rng.choice(len(sources), size=batch)]).numel()
        for _ in range(20)
    ] if sources else [0]
    vocab = shortlist.tgt_vocab_size
    return (
        f"output layer: {vocab} pieces; shortlist of one sentence: {single:.0f} on average "
        f"({100 * single / vocab:.1f}%), of a batch of {batch} sentences: {np.mean(batches):.0f} "
        f"({100 * np.mean(batches) / vocab:.1f}%)"
    )


def run(cfg: DictConfig) -> None:
    """Build as configured."""
    for key in ("checkpoint", "src", "tgt", "output"):
        if OmegaConf.is_missing(cfg, key) or not cfg[key]:
            fail(f"no {key} given: add {key}=PATH")
    check_types(cfg, {"per_source": int, "frequent": int, "batch_sentences": int})
    for key, least in (("per_source", 0), ("frequent", 0), ("batch_sentences", 1)):
        if cfg[key] < least:
            fail(f"{key} must be at least {least}, got {cfg[key]}")
    started = time.perf_counter()
    try:
        tokenizers = tokenizers_from_payload(load_checkpoint(cfg.checkpoint)["tokenizers"])
        sources, targets = read_lines(Path(cfg.src)), read_lines(Path(cfg.tgt))
        if len(sources) != len(targets):
            raise DataError(f"{cfg.src} has {len(sources)} lines but {cfg.tgt} has {len(targets)}")
        if not sources:
            raise DataError(f"{cfg.src} is empty")
        src_ids, tgt_ids = encode(tokenizers.src, sources), encode(tokenizers.tgt, targets)
        shortlist = Shortlist.build(
            src_ids, tgt_ids,
            src_vocab_size=tokenizers.src.vocab_size, tgt_vocab_size=tokenizers.tgt.vocab_size,
            per_source=cfg.per_source, frequent=cfg.frequent,
            same_piece=same_pieces(tokenizers), fingerprint=vocabulary_fingerprint(tokenizers),
        )
        shortlist.save(cfg.output)
    except (CheckpointError, DataError, ShortlistError) as error:
        fail(error)
    except OSError as error:
        fail(f"cannot write {cfg.output}: {error.strerror or error}")
    print(
        f"built {cfg.output} from {len(sources)} pairs in {time.perf_counter() - started:.1f}s: "
        f"{shortlist.candidates.size} candidates for "
        f"{int((np.diff(shortlist.offsets) > 0).sum())} source pieces, "
        f"{shortlist.frequent.size} frequent pieces"
    )
    print(size_report(shortlist, src_ids, cfg.batch_sentences))


# The previous release's flags, still read (with a warning): --name VALUE is name=VALUE.
FLAGS = {"--checkpoint": "checkpoint", "--src": "src", "--tgt": "tgt", "--output": "output",
         "--per-source": "per_source", "--frequent": "frequent",
         "--batch-sentences": "batch_sentences"}
main = hydra_tool(run, config_name="build_shortlist", summary=__doc__.splitlines()[0],
                  old_flags=FLAGS)


if __name__ == "__main__":
    main()
