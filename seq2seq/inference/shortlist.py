"""Output-vocabulary shortlists: decode with only the target pieces a batch plausibly needs.

As Marian's lexical shortlists on CPUs: a table built once from the training pairs
(``seq2seq-build-shortlist``) lists, per source piece, the target pieces that tend to
appear in its translations. Decoding a batch (``Translator(..., shortlist=...)``,
``shortlist=PATH`` on the command lines) then scores only

    the special pieces (ids 0-3) + the ``frequent`` most frequent target pieces
    + the candidates of every source piece of the batch (+ the same piece, where it exists)

instead of the whole vocabulary: the output layer, the softmax and the beam's top-k shrink
with it. The search runs on shortlist positions (0..K-1, the special ids keep their positions
because they are the smallest ids), the model scoring only those pieces (``decode_step``'s
``output_ids``: the PyTorch model computes only those rows of its output layer, an ensemble
renormalises each member over them, an exported graph scores every piece and the columns are
kept), and the translations are mapped back to real ids
(:func:`~seq2seq.inference.search_loop.run_search`'s ``output_ids``).

Candidates are ranked by sentence-level Dice, ``2 c(s, t) / (c(s) + c(t))`` (``c``: sentences
containing the piece(s)), each source piece keeping its ``per_source`` best besides the frequent
and special pieces; a coverage pass then makes every target piece of a training pair reachable
from that pair's source. docs/evaluate-translate.md ("Output-vocabulary shortlists") gives the
rest: scores, the vocabulary check, measurements.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from seq2seq.atomic import atomic_write
from seq2seq.checkpoint import load_weights_only
from seq2seq.data.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID

SPECIAL_IDS = np.array(sorted((PAD_ID, UNK_ID, BOS_ID, EOS_ID)), dtype=np.int64)
FORMAT = "seq2seq-shortlist"
VERSION = 1
_CHUNK_PAIRS = 4_000_000  # (source, target) co-occurrences expanded at once


class ShortlistError(ValueError):
    """A shortlist that cannot be used; the message says why in one line."""


def vocabulary_fingerprint(tokenizers) -> str:
    """A hash of the source and target piece lists (a shortlist's ids only mean these)."""
    digest = hashlib.sha256()
    for side in (tokenizers.src, tokenizers.tgt):
        digest.update("\n".join(side.pieces(range(side.vocab_size))).encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def same_pieces(tokenizers) -> np.ndarray:
    """Per source id, the target id of the same piece, or -1 (special pieces: -1)."""
    tgt = tokenizers.tgt
    target = {piece: i for i, piece in enumerate(tgt.pieces(range(tgt.vocab_size)))}
    source = tokenizers.src.pieces(range(tokenizers.src.vocab_size))
    mapping = np.array([target.get(piece, -1) for piece in source], dtype=np.int64)
    mapping[SPECIAL_IDS] = -1  # always included anyway
    return mapping


def _flatten(sequences: Sequence[Sequence[int]], vocab_size: int, side: str):
    """Per-sentence unique ids: (sentence index, id) sorted, and the token counts."""
    lengths = np.fromiter((len(ids) for ids in sequences), dtype=np.int64, count=len(sequences))
    flat = np.fromiter(
        (int(i) for ids in sequences for i in ids), dtype=np.int64, count=int(lengths.sum())
    )
    if flat.size and (flat.min() < 0 or flat.max() >= vocab_size):
        raise ShortlistError(f"{side} ids must lie in [0, {vocab_size})")
    sentence = np.repeat(np.arange(len(sequences), dtype=np.int64), lengths)
    unique = np.unique(sentence * vocab_size + flat)
    token_counts = np.bincount(flat, minlength=vocab_size)
    return unique // vocab_size, unique % vocab_size, token_counts


def _sentence_pairs(src_sent, src_id, tgt_sent, tgt_id, count) -> Iterator[tuple]:
    """(sentence, source id, target id) of every co-occurrence, some million at a time."""
    src_per_sentence = np.bincount(src_sent, minlength=count)
    tgt_per_sentence = np.bincount(tgt_sent, minlength=count)
    tgt_start = np.concatenate([[0], np.cumsum(tgt_per_sentence)[:-1]])
    pairs_before = np.concatenate([[0], np.cumsum(src_per_sentence * tgt_per_sentence)])
    first = 0
    while first < count:  # sentences first..last-1: about _CHUNK_PAIRS pairs (at least one)
        end = np.searchsorted(pairs_before, pairs_before[first] + _CHUNK_PAIRS, side="right")
        last = max(first + 1, int(end) - 1)
        rows = np.arange(*np.searchsorted(src_sent, [first, last]))
        first = last
        sent = src_sent[rows]
        repeats = tgt_per_sentence[sent]
        total = int(repeats.sum())
        block_start = np.repeat(np.cumsum(repeats) - repeats, repeats)
        within = np.arange(total, dtype=np.int64) - block_start
        targets = tgt_id[np.repeat(tgt_start[sent], repeats) + within]
        yield np.repeat(sent, repeats), np.repeat(src_id[rows], repeats), targets


def _lookup(sorted_keys: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of ``keys`` in ``sorted_keys`` and whether they are there."""
    if sorted_keys.size == 0:
        return np.zeros(keys.shape, np.int64), np.zeros(keys.shape, bool)
    position = np.minimum(np.searchsorted(sorted_keys, keys), sorted_keys.size - 1)
    return position, sorted_keys[position] == keys


class Shortlist:
    """Candidate target ids per source id (CSR arrays) plus the always-included ids.

    Args:
        offsets: (source vocabulary + 1,) int64; source id ``s``'s candidates are
            ``candidates[offsets[s]:offsets[s + 1]]``.
        candidates: target ids.
        frequent: target ids always included (with the special ids 0-3).
        tgt_vocab_size: the model's output size.
        same_piece: per source id, the target id of the same piece (included), or -1; optional.
        fingerprint: :func:`vocabulary_fingerprint` of the tokenizers it was built for.
        name: what to call it in messages (its file, once loaded).
    """

    def __init__(self, *, offsets, candidates, frequent, tgt_vocab_size: int, same_piece=None,
                 fingerprint: str = "", name: str = "the shortlist") -> None:
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.candidates = np.asarray(candidates, dtype=np.int64)
        self.frequent = np.asarray(frequent, dtype=np.int64)
        self.tgt_vocab_size = int(tgt_vocab_size)
        self.same_piece = None if same_piece is None else np.asarray(same_piece, dtype=np.int64)
        self.fingerprint = fingerprint
        self.name = name
        src_vocab = self.src_vocab_size
        ok = (
            src_vocab >= 0 and self.offsets[0] == 0 and self.offsets[-1] == self.candidates.size
            and bool(np.all(np.diff(self.offsets) >= 0))
            and all(a.size == 0 or (a.min() >= 0 and a.max() < self.tgt_vocab_size)
                    for a in (self.candidates, self.frequent))
            and (self.same_piece is None or (self.same_piece.size == src_vocab
                                             and self.same_piece.max(initial=-1) < tgt_vocab_size))
        )
        if not ok or self.tgt_vocab_size <= int(SPECIAL_IDS[-1]):
            raise ShortlistError(f"{name} is inconsistent (bad offsets or ids out of range)")

    @property
    def src_vocab_size(self) -> int:
        return self.offsets.size - 1

    @classmethod
    def build(cls, src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]], *,
              src_vocab_size: int, tgt_vocab_size: int, per_source: int = 50, frequent: int = 200,
              same_piece=None, fingerprint: str = "") -> Shortlist:
        """Build from training pairs given as piece ids (as the checkpoint's tokenizers encode)."""
        if per_source < 0 or frequent < 0:
            raise ShortlistError("per_source and frequent must not be negative")
        if len(src_ids) != len(tgt_ids):
            raise ShortlistError(f"{len(src_ids)} source but {len(tgt_ids)} target sentences")
        count, vt = len(src_ids), tgt_vocab_size
        src_sent, src_id, _ = _flatten(src_ids, src_vocab_size, "source")
        tgt_sent, tgt_id, tgt_tokens = _flatten(tgt_ids, vt, "target")
        tgt_tokens[SPECIAL_IDS] = 0
        by_count = np.lexsort((np.arange(vt), -tgt_tokens))  # most frequent first, then id
        always = np.sort(by_count[: min(frequent, int((tgt_tokens > 0).sum()))])
        excluded = np.zeros(vt, bool)
        excluded[SPECIAL_IDS] = True
        excluded[always] = True

        # Co-occurrence counts of (source, target) pairs, and their Dice coefficients.
        chunks = [np.unique(s * vt + t, return_counts=True)
                  for _, s, t in _sentence_pairs(src_sent, src_id, tgt_sent, tgt_id, count)]
        keys = np.concatenate([k for k, _ in chunks]) if chunks else np.zeros(0, np.int64)
        counts = np.concatenate([c for _, c in chunks]) if chunks else np.zeros(0, np.int64)
        keys, inverse = np.unique(keys, return_inverse=True)
        counts = np.bincount(inverse.reshape(-1), weights=counts, minlength=keys.size)
        src_sentences = np.bincount(src_id, minlength=src_vocab_size)
        tgt_sentences = np.bincount(tgt_id, minlength=vt)
        dice = 2 * counts / (src_sentences[keys // vt] + tgt_sentences[keys % vt])
        pair_s, pair_t = keys // vt, keys % vt

        # The per_source best of each source piece (ties: the smaller target id).
        usable = ~excluded[pair_t]
        order = np.lexsort((pair_t[usable], -dice[usable], pair_s[usable]))
        ranked_s, ranked_t = pair_s[usable][order], pair_t[usable][order]
        rank = np.arange(order.size) - np.searchsorted(ranked_s, ranked_s, side="left")
        kept = np.sort((ranked_s * vt + ranked_t)[rank < per_source])

        # Coverage: each sentence's target pieces must be reachable from its own source pieces.
        additions = []
        for sent, s, t in _sentence_pairs(src_sent, src_id, tgt_sent, tgt_id, count):
            needed = ~excluded[t]
            sent, s, t = sent[needed], s[needed], t[needed]
            pair_key = sent * vt + t
            covered = np.unique(pair_key[_lookup(kept, s * vt + t)[1]])
            missing = ~_lookup(covered, pair_key)[1]
            if not missing.any():
                continue
            sent, s, t, pair_key = sent[missing], s[missing], t[missing], pair_key[missing]
            score = dice[_lookup(keys, s * vt + t)[0]]
            best = np.lexsort((s, -score, pair_key))  # per (sentence, target): best Dice first
            first = np.concatenate([[True], pair_key[best][1:] != pair_key[best][:-1]])
            additions.append(s[best][first] * vt + t[best][first])
        final = np.unique(np.concatenate([kept, *additions]))
        offsets = np.searchsorted(final // vt, np.arange(src_vocab_size + 1), side="left")
        return cls(offsets=offsets, candidates=final % vt, frequent=always, tgt_vocab_size=vt,
                   same_piece=same_piece, fingerprint=fingerprint)

    def for_sources(self, sources: Sequence[Sequence[int]]) -> Tensor:
        """Sorted unique target ids for a batch: special (positions 0-3), frequent, candidates.

        Shape:
            - output: (K,) int64, ``output[:4] == [0, 1, 2, 3]``
        """
        arrays = [np.asarray(ids, dtype=np.int64).reshape(-1) for ids in sources]
        present = np.unique(np.concatenate(arrays)) if arrays else np.zeros(0, np.int64)
        if present.size and (present[0] < 0 or present[-1] >= self.src_vocab_size):
            raise ShortlistError(f"source ids must lie in [0, {self.src_vocab_size})")
        starts, ends = self.offsets[present], self.offsets[present + 1]
        lengths = ends - starts
        positions = np.repeat(starts - np.cumsum(lengths) + lengths, lengths)
        positions += np.arange(int(lengths.sum()), dtype=np.int64)
        parts = [SPECIAL_IDS, self.frequent, self.candidates[positions]]
        if self.same_piece is not None:
            same = self.same_piece[present]
            parts.append(same[same >= 0])
        return torch.from_numpy(np.unique(np.concatenate(parts)))

    def check_vocabulary(self, tokenizers) -> None:
        """Raise ShortlistError when built for other vocabularies than ``tokenizers``'."""
        fingerprint = vocabulary_fingerprint(tokenizers)
        if fingerprint != self.fingerprint:
            raise ShortlistError(
                f"{self.name} was built for other vocabularies than the model's (fingerprint "
                f"{self.fingerprint or 'none'}, the model's {fingerprint}): rebuild it with "
                "seq2seq-build-shortlist --checkpoint ..."
            )

    # -- file -----------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        payload = {
            "format": FORMAT, "version": VERSION, "fingerprint": self.fingerprint,
            "tgt_vocab_size": self.tgt_vocab_size, "offsets": torch.from_numpy(self.offsets),
            "candidates": torch.from_numpy(self.candidates),
            "frequent": torch.from_numpy(self.frequent),
        }
        if self.same_piece is not None:
            payload["same_piece"] = torch.from_numpy(self.same_piece)
        with atomic_write(path) as handle:
            torch.save(payload, handle)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Shortlist:
        """Read a shortlist file (weights only). Raises ShortlistError on a bad file."""
        path = Path(path)
        payload = load_weights_only(path, "shortlist", ShortlistError, map_location="cpu")
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise ShortlistError(
                f"{path} is not a shortlist (build one with seq2seq-build-shortlist)"
            )
        if payload.get("version") != VERSION:
            raise ShortlistError(
                f"{path} has shortlist version {payload.get('version')}, not {VERSION}"
            )
        same = payload.get("same_piece")
        return cls(offsets=payload["offsets"].numpy(), candidates=payload["candidates"].numpy(),
                   frequent=payload["frequent"].numpy(), tgt_vocab_size=payload["tgt_vocab_size"],
                   same_piece=None if same is None else same.numpy(),
                   fingerprint=str(payload["fingerprint"]), name=f"shortlist {path}")
