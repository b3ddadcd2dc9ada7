"""What a trained vocabulary cannot write of new training text, and the extension that can.

A fine-tuned model keeps its parent's sentencepiece model(s). New text may hold characters the
model has no piece for (they encode to UNK_ID) and, on the target side of a pruned joint
vocabulary (:class:`~seq2seq.data.tokenizer.SubsetTokenizer`), pieces outside the kept subset
(also UNK_ID there). :func:`measure_coverage` counts the sentences such pieces touch and
collects them; :func:`extend_tokenizers` appends them after the parent's ids, so every old id
keeps its meaning and a sentence the parent could write is encoded exactly as before.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from seq2seq.data.text_files import iter_parallel_chunks
from seq2seq.data.tokenizer import SentencePieceTokenizer, SubsetTokenizer, Tokenizers
from seq2seq.data.vocab import UNK_ID


@dataclass
class SideCoverage:
    """One side of the training pairs against its vocabulary.

    Attributes:
        sentences: Sentences read (of pairs with text on both sides, those training can use).
        unknown_sentences: Sentences with a piece the vocabulary lacks.
        missing_characters: Character -> sentences it occurs in, for characters without a piece.
    """

    sentences: int = 0
    unknown_sentences: int = 0
    missing_characters: Counter = field(default_factory=Counter)

    @property
    def unknown_share(self) -> float:
        """The share of sentences with a piece the vocabulary lacks, in [0, 1]."""
        return self.unknown_sentences / self.sentences if self.sentences else 0.0


@dataclass
class VocabularyCoverage:
    """Both sides of new training pairs against a model's tokenizers.

    Attributes:
        src / tgt: Each side's counts.
        unkept_target_ids: Base ids of the joint model, outside a pruned target subset, that the
            new targets use (empty without a subset).
    """

    src: SideCoverage
    tgt: SideCoverage
    unkept_target_ids: list[int]

    def format(self, whose: str = "parent vocabulary") -> str:
        """One log line: ``parent vocabulary: 2.3 % of source and 0.4 % of target sentences
        have pieces it lacks (unknown)``."""
        return (f"{whose}: {_percent(self.src.unknown_share)} % of source and "
                f"{_percent(self.tgt.unknown_share)} % of target sentences have pieces it lacks "
                "(unknown)")


def _percent(share: float) -> str:
    """A share as a percentage with one decimal; a few sentences in very many never read 0.0."""
    return "< 0.1" if 0 < share < 0.0005 else f"{100 * share:.1f}"


def _count_side(side: SideCoverage, tokenizer: SentencePieceTokenizer, known: frozenset[str],
                sentences: list[str], kept: np.ndarray | None) -> set[int]:
    """Adds a chunk's sentences to ``side``; returns the base ids outside ``kept`` they use."""
    unkept: set[int] = set()
    for sentence, ids in zip(sentences, tokenizer.encode(sentences), strict=True):
        side.sentences += 1
        ids = np.asarray(ids, dtype=np.int64)
        lacks_character = bool((ids == UNK_ID).any())
        outside = ids[~kept[ids]] if kept is not None and ids.size else ids[:0]
        if lacks_character or outside.size:
            side.unknown_sentences += 1
        if lacks_character:
            side.missing_characters.update(set(tokenizer.normalize(sentence)) - known)
        unkept.update(outside.tolist())
    return unkept


def measure_coverage(tokenizers: Tokenizers,
                     files: Iterable[tuple[Path, Path]]) -> VocabularyCoverage:
    """Counts, per side, the training sentences with pieces ``tokenizers`` lack, and collects
    those pieces, in one pass over the files (streamed, never held whole).

    ``files``: (source file, target file) of each training corpus; DataError as
    `iter_parallel_chunks` raises it.
    """
    src_base, tgt_base = tokenizers.src, tokenizers.target_model
    kept = None
    if isinstance(tokenizers.tgt, SubsetTokenizer):
        kept = np.zeros(tgt_base.vocab_size, dtype=bool)
        kept[tokenizers.tgt.kept_ids] = True
    known = {"src": src_base.characters(), "tgt": tgt_base.characters()}
    coverage = VocabularyCoverage(src=SideCoverage(), tgt=SideCoverage(), unkept_target_ids=[])
    unkept: set[int] = set()
    for src_path, tgt_path in files:
        for src_chunk, tgt_chunk in iter_parallel_chunks(src_path, tgt_path):
            # Pairs empty on a side never train (the length filter drops them): not counted.
            pairs = [(s, t) for s, t in zip(src_chunk, tgt_chunk, strict=True)
                     if s.strip() and t.strip()]
            _count_side(coverage.src, src_base, known["src"], [s for s, _ in pairs], None)
            unkept |= _count_side(coverage.tgt, tgt_base, known["tgt"], [t for _, t in pairs],
                                  kept)
    coverage.unkept_target_ids = sorted(unkept)
    return coverage


def _by_frequency(characters: Counter) -> list[str]:
    """Most frequent first, ties in code point order: the same data gives the same ids."""
    return sorted(characters, key=lambda character: (-characters[character], character))


def extend_tokenizers(tokenizers: Tokenizers, coverage: VocabularyCoverage) -> Tokenizers:
    """``tokenizers`` with the pieces ``coverage`` found missing appended after the old ids.

    Each sentencepiece model gains the characters its side lacks (a joint model those of both
    sides); a pruned target subset keeps its compact ids and appends, in this order, the old
    base pieces the new targets use and the new characters of the targets.
    """
    if tokenizers.joint:
        both = coverage.src.missing_characters + coverage.tgt.missing_characters
        src = tokenizers.src.with_characters(_by_frequency(both))
        if not isinstance(tokenizers.tgt, SubsetTokenizer):
            return Tokenizers.of(src)
        new_ids = [src.vocab_size - len(both) + index for index, character
                   in enumerate(_by_frequency(both))
                   if character in coverage.tgt.missing_characters]
        kept = [*tokenizers.tgt.kept_ids.tolist(), *coverage.unkept_target_ids, *new_ids]
        return Tokenizers.of(src, kept_ids=kept)
    return Tokenizers.of(
        tokenizers.src.with_characters(_by_frequency(coverage.src.missing_characters)),
        tokenizers.tgt.with_characters(_by_frequency(coverage.tgt.missing_characters)),
    )


def count_new_pieces(parent: Tokenizers, child: Tokenizers) -> tuple[int, int]:
    """(source, target) pieces ``child`` has beyond ``parent``."""
    return (child.src.vocab_size - parent.src.vocab_size,
            child.tgt.vocab_size - parent.tgt.vocab_size)
