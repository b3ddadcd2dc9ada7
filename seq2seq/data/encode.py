"""Encoding a split into token files, filtering training pairs, pruning the target vocabulary.

A split is streamed in chunks of lines, encoded, optionally filtered (empty side, too long,
length ratio) and appended to `<directory>/<split>.{src,tgt}.{tokens,offsets}.npy`, so a
corpus never has to fit in memory. A training split of several corpora holds them one after
another, in the order given; a corpus's tag goes before each of its sources after filtering
(so it counts against no length limit).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from seq2seq.console import count_bar
from seq2seq.data.dataset import TOKENS_SUFFIX, TokenArrayWriter
from seq2seq.data.settings import FilterSettings
from seq2seq.data.text_files import iter_parallel_chunks
from seq2seq.data.tokenizer import SubsetTokenizer, Tokenizers
from seq2seq.data.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID

DROP_REASONS = ("empty", "too_long", "length_ratio")
ENCODE_CHUNK_LINES = 10_000
# Token files are remapped in blocks of this many ids, never loaded whole.
_REMAP_BLOCK = 1 << 24
# The output layer's rows are rounded up to a multiple of this: the products of an odd row count
# run well below the CPU's matrix speed (docs/speed.md); 64 is a multiple of every vector width.
OUTPUT_ROWS_MULTIPLE = 64


def _token_dtype(vocab_size: int) -> type[np.integer]:
    """Smallest token dtype on disk for a vocabulary size (half the bytes of int32 mostly)."""
    return np.uint16 if vocab_size < 65535 else np.int32


class SplitSource(NamedTuple):
    """One file pair of a split, and the piece id put before each of its sources."""

    src: Path
    tgt: Path
    tag_id: int | None = None


def encode_split(
    *,
    split: str,
    sources: Sequence[SplitSource],
    tokenizers: Tokenizers,
    filter: FilterSettings | None,
    directory: Path,
    progress: bool | None,
) -> dict[str, Any]:
    """Encodes one split into `<directory>/<split>.{src,tgt}.*.npy`.

    Args:
        sources: Its file pair(s), encoded one after the other into the same files.
        filter: Filter settings, or None to keep every pair in order (valid/test).
        progress: Show a progress bar (None: only when stderr is a terminal).

    Returns:
        The split's statistics for the summary (pairs read, kept, dropped by reason, ...),
        with "parts": those of each source (pairs read, kept, dropped by reason).
    """
    dtypes = {
        "src": _token_dtype(tokenizers.src.vocab_size),
        "tgt": _token_dtype(tokenizers.tgt.vocab_size),
    }
    writers = {
        side: TokenArrayWriter(prefix=directory / f"{split}.{side}", dtype=dtype)
        for side, dtype in dtypes.items()
    }
    dropped = dict.fromkeys(DROP_REASONS, 0)
    totals = {"src": 0, "tgt": 0}
    unknown = {"src": 0, "tgt": 0}
    empty_kept = 0
    parts = []
    try:
        with count_bar(None, description=f"encoding {split}", unit=" pairs", unit_scale=True,
                       enabled=progress) as bar:
            for source in sources:
                part = {"pairs_read": 0, "pairs_kept": 0,
                        "dropped": dict.fromkeys(DROP_REASONS, 0)}
                parts.append(part)
                empty_kept += _encode_source(
                    source=source, tokenizers=tokenizers, filter=filter, dtypes=dtypes,
                    writers=writers, part=part, totals=totals, unknown=unknown, bar=bar)
                for reason, count in part["dropped"].items():
                    dropped[reason] += count
        for writer in writers.values():
            writer.close()
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    read = sum(part["pairs_read"] for part in parts)
    kept = writers["src"].sentences
    stats: dict[str, Any] = {
        "src_file": str(sources[0].src),
        "tgt_file": str(sources[0].tgt),
        "filtered": filter is not None,
        "pairs_read": read,
        "pairs_kept": kept,
        "dropped": dropped,
        "src_tokens": totals["src"],
        "tgt_tokens": totals["tgt"],
        "src_mean_pieces": totals["src"] / kept if kept else 0.0,
        "tgt_mean_pieces": totals["tgt"] / kept if kept else 0.0,
        "src_unknown_pieces": unknown["src"],
        "tgt_unknown_pieces": unknown["tgt"],
    }
    if filter is None:
        stats["empty_pairs_kept"] = empty_kept
    stats["parts"] = parts
    return stats


def _encode_source(
    *,
    source: SplitSource,
    tokenizers: Tokenizers,
    filter: FilterSettings | None,
    dtypes: dict[str, Any],
    writers: dict[str, TokenArrayWriter],
    part: dict[str, Any],
    totals: dict[str, int],
    unknown: dict[str, int],
    bar: Any,
) -> int:
    """Appends one file pair to the split's writers; returns its empty pairs kept
    (unfiltered splits) and adds its counts to `part`, `totals` and `unknown`."""
    empty_kept = 0
    for src_chunk, tgt_chunk in iter_parallel_chunks(
        source.src, source.tgt, chunk_lines=ENCODE_CHUNK_LINES
    ):
        count = len(src_chunk)
        part["pairs_read"] += count
        encoded = {
            "src": tokenizers.src.encode(src_chunk),
            "tgt": tokenizers.tgt.encode(tgt_chunk),
        }
        lengths = {
            side: np.fromiter(map(len, ids), dtype=np.int64, count=count)
            for side, ids in encoded.items()
        }
        flat = {
            side: np.fromiter(
                chain.from_iterable(encoded[side]),
                dtype=dtypes[side],
                count=int(lengths[side].sum()),
            )
            for side in encoded
        }
        del encoded  # the Python lists cost far more memory than the arrays
        if filter is not None:
            keep = _filter_chunk(
                src_lengths=lengths["src"],
                tgt_lengths=lengths["tgt"],
                settings=filter,
                dropped=part["dropped"],
            )
            if not keep.all():
                for side in flat:
                    flat[side] = flat[side][np.repeat(keep, lengths[side])]
                    lengths[side] = lengths[side][keep]
        else:
            empty_kept += int(((lengths["src"] == 0) | (lengths["tgt"] == 0)).sum())
        if source.tag_id is not None:
            starts = np.cumsum(lengths["src"]) - lengths["src"]
            flat["src"] = np.insert(flat["src"], starts, source.tag_id)
            lengths["src"] = lengths["src"] + 1
        for side, writer in writers.items():
            writer.append(flat[side], lengths[side])
            totals[side] += len(flat[side])
            unknown[side] += int(np.count_nonzero(flat[side] == UNK_ID))
        part["pairs_kept"] += len(lengths["src"])
        bar.update(count)
    return empty_kept


def _filter_chunk(
    *,
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    settings: FilterSettings,
    dropped: dict[str, int],
) -> np.ndarray:
    """Returns the mask of pairs to keep; adds the dropped ones to `dropped` by first reason."""
    empty = (src_lengths == 0) | (tgt_lengths == 0)
    remaining = ~empty
    too_long = np.zeros_like(empty)
    if settings.max_length is not None:
        too_long = remaining & (
            (src_lengths > settings.max_length) | (tgt_lengths > settings.max_length)
        )
        remaining &= ~too_long
    bad_ratio = np.zeros_like(empty)
    if settings.max_length_ratio is not None:
        longer = np.maximum(src_lengths, tgt_lengths)
        shorter = np.minimum(src_lengths, tgt_lengths)
        bad_ratio = remaining & (longer > settings.max_length_ratio * shorter)
        remaining &= ~bad_ratio
    dropped["empty"] += int(empty.sum())
    dropped["too_long"] += int(too_long.sum())
    dropped["length_ratio"] += int(bad_ratio.sum())
    return remaining


def fillers_to_a_multiple(seen: np.ndarray, *, excluded: Sequence[int],
                          multiple: int) -> np.ndarray:
    """The ids to add to ``seen`` (a boolean mask over the vocabulary) so that it counts a
    multiple of ``multiple``: the unseen ones of the highest ids, never one of ``excluded``;
    none where there are too few to reach it."""
    candidates = np.setdiff1d(np.flatnonzero(~seen), excluded)  # sorted
    shortfall = -int(seen.sum()) % multiple
    if shortfall == 0 or shortfall > len(candidates):
        return candidates[:0]
    return candidates[-shortfall:]


def prune_target_vocabulary(*, tokenizers: Tokenizers, directory: Path,
                            split: str) -> tuple[Tokenizers, int]:
    """Keeps on the target side only the pieces of `split`'s encoded targets; remaps them.

    Called on the training split right after it is encoded with the full joint model, before
    the other splits are encoded: those then use the subset (a piece it does not keep becomes
    UNK). The kept pieces are rounded up to a multiple of :data:`OUTPUT_ROWS_MULTIPLE` with the
    unseen pieces of the highest ids (rare whole words and single characters; never a corpus
    tag) where the vocabulary has enough.

    Returns:
        The tokenizers with a SubsetTokenizer as target, and how many of its pieces occur in
        the training targets.
    """
    tokens = np.load(Path(f"{directory / split}.tgt{TOKENS_SUFFIX}"), mmap_mode="r+")
    seen = np.zeros(tokenizers.tgt.vocab_size, dtype=bool)
    for start in range(0, len(tokens), _REMAP_BLOCK):
        seen[tokens[start : start + _REMAP_BLOCK]] = True
    seen[[PAD_ID, UNK_ID, BOS_ID, EOS_ID]] = True  # a subset always keeps them
    occurring = int(seen.sum())
    tags = set(tokenizers.tgt.user_symbols)  # never an output row for a corpus tag
    tag_ids = [i for i in np.flatnonzero(~seen) if tokenizers.tgt.id_to_piece(int(i)) in tags]
    seen[fillers_to_a_multiple(seen, excluded=tag_ids, multiple=OUTPUT_ROWS_MULTIPLE)] = True
    subset = SubsetTokenizer(base=tokenizers.tgt, kept_ids=np.flatnonzero(seen))
    for start in range(0, len(tokens), _REMAP_BLOCK):
        block = tokens[start : start + _REMAP_BLOCK]
        tokens[start : start + _REMAP_BLOCK] = subset.to_compact[block]
    tokens.flush()
    del tokens
    return Tokenizers(src=tokenizers.src, tgt=subset, joint=True), occurring
