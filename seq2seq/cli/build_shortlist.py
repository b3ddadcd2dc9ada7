"""Build an output-vocabulary shortlist for a checkpoint from its training pairs.

    seq2seq-build-shortlist --checkpoint runs/x/checkpoints/best.pt \\
        --src data/multi30k/train.de.gz --tgt data/multi30k/train.en.gz --output shortlist.pt
    seq2seq-translate checkpoint=runs/x/checkpoints/best.pt shortlist=shortlist.pt < test.de

The pairs are encoded with the checkpoint's own tokenizers (so the ids are the model's),
each source piece keeps its ``--per-source`` target pieces of highest sentence-level Dice
co-occurrence, the ``--frequent`` most frequent target pieces are always included, and every
target piece of every training pair stays reachable from its source
(:mod:`seq2seq.inference.shortlist`). Prints the sizes it gives: per sentence and per batch of
``--batch-sentences`` training sentences. Exit status 1 with a one-line ``error: ...`` on a bad
checkpoint, a missing or unreadable file, or files of different lengths.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from seq2seq.checkpoint import CheckpointError, load_checkpoint, tokenizers_from_payload
from seq2seq.config_types import error_reason
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="seq2seq-build-shortlist",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="the model's checkpoint (its tokenizers)")
    parser.add_argument("--src", required=True, help="training sources, one a line (plain or .gz)")
    parser.add_argument("--tgt", required=True, help="their references, line by line")
    parser.add_argument("--output", required=True, help="where to write the shortlist")
    parser.add_argument("--per-source", type=int, default=50,
                        help="candidate target pieces kept per source piece (default 50)")
    parser.add_argument("--frequent", type=int, default=200,
                        help="most frequent target pieces always included (default 200)")
    parser.add_argument("--batch-sentences", type=int, default=100,
                        help="batch size of the size report (default 100)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        if args.per_source < 0 or args.frequent < 0 or args.batch_sentences < 1:
            raise ShortlistError("--per-source and --frequent must be >= 0, --batch-sentences >= 1")
        tokenizers = tokenizers_from_payload(load_checkpoint(args.checkpoint)["tokenizers"])
        sources, targets = read_lines(Path(args.src)), read_lines(Path(args.tgt))
        if len(sources) != len(targets):
            raise DataError(f"{args.src} has {len(sources)} lines but {args.tgt} has {len(targets)}")
        if not sources:
            raise DataError(f"{args.src} is empty")
        src_ids, tgt_ids = encode(tokenizers.src, sources), encode(tokenizers.tgt, targets)
        shortlist = Shortlist.build(
            src_ids, tgt_ids,
            src_vocab_size=tokenizers.src.vocab_size, tgt_vocab_size=tokenizers.tgt.vocab_size,
            per_source=args.per_source, frequent=args.frequent,
            same_piece=same_pieces(tokenizers), fingerprint=vocabulary_fingerprint(tokenizers),
        )
        shortlist.save(args.output)
    except (CheckpointError, DataError, ShortlistError) as error:
        print(f"error: {error_reason(error)}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"error: cannot write {args.output}: {error.strerror or error}", file=sys.stderr)
        return 1
    print(
        f"built {args.output} from {len(sources)} pairs in {time.perf_counter() - started:.1f}s: "
        f"{shortlist.candidates.size} candidates for "
        f"{int((np.diff(shortlist.offsets) > 0).sum())} source pieces, "
        f"{shortlist.frequent.size} frequent pieces"
    )
    print(size_report(shortlist, src_ids, args.batch_sentences))
    return 0


if __name__ == "__main__":
    sys.exit(main())
