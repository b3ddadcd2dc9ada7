"""sentencepiece tokenizers with the framework's fixed special ids, trained from streams."""

from __future__ import annotations

import io
import logging
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import takewhile
from pathlib import Path

import numpy as np
import sentencepiece as spm

from seq2seq.atomic import write_bytes
from seq2seq.data.text_files import DataError
from seq2seq.data.vocab import (
    BOS_ID,
    BOS_PIECE,
    EOS_ID,
    EOS_PIECE,
    PAD_ID,
    PAD_PIECE,
    UNK_ID,
    UNK_PIECE,
)

logger = logging.getLogger(__name__)

MODEL_TYPES = ("bpe", "unigram")

# sentencepiece refuses 1..100 for input_sentence_size (its sampler needs more than 100).
_MIN_SAMPLED_SENTENCES = 101
_VOCAB_TOO_HIGH = re.compile(
    r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)"
)


def _checked_id(token_id: int, vocab_size: int) -> int:
    token_id = int(token_id)
    if not 0 <= token_id < vocab_size:
        raise IndexError(f"id {token_id} outside the vocabulary of {vocab_size} pieces")
    return token_id


class _SentenceFeed:
    """Wraps the sentence stream handed to sentencepiece's C++ trainer.

    sentencepiece turns any exception raised by the iterator into a generic RuntimeError; this
    keeps the original (e.g. a DataError naming a bad line) so it can be re-raised as is.
    """

    def __init__(self, *, sentences: Iterable[str]) -> None:
        self._iterator = iter(sentences)
        self.error: BaseException | None = None
        self.count = 0

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        try:
            sentence = next(self._iterator)
        except StopIteration:
            raise
        except BaseException as error:
            self.error = error
            raise
        self.count += 1
        return sentence


@dataclass(frozen=True)
class SubwordSampling:
    """One draw of subword regularization, in sentencepiece's terms.

    Attributes:
        alpha: For a bpe model the probability that a merge is dropped (BPE-dropout, Provilkov
            et al., 2020); for a unigram model the smoothing of the sampled segmentations'
            distribution (Kudo, 2018). Both sample among all segmentations (``nbest_size=-1``).
        seed: Seed of sentencepiece's generator for this draw.
    """

    alpha: float
    seed: int


class SentencePieceTokenizer:
    """A sentencepiece model whose pad/unk/bos/eos ids are PAD_ID, UNK_ID, BOS_ID, EOS_ID.

    Encoding returns the pieces of a sentence only: adding bos/eos is the batching code's job.
    """

    def __init__(self, *, model_proto: bytes) -> None:
        """Loads a serialized sentencepiece model (a .model file's bytes).

        Raises:
            ValueError: If the bytes are not a sentencepiece model or its special ids differ
                from the framework's fixed ones.
        """
        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(model_proto)
        except (RuntimeError, OSError) as error:
            raise ValueError(f"not a sentencepiece model: {error}") from None
        special_ids = (
            processor.pad_id(),
            processor.unk_id(),
            processor.bos_id(),
            processor.eos_id(),
        )
        if special_ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise ValueError(
                f"sentencepiece model has special ids (pad, unk, bos, eos) = {special_ids}, "
                f"expected {(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}"
            )
        self._processor = processor
        self._model_proto = bytes(model_proto)
        self._leading_symbol: re.Pattern[str] | None = None
        self._user_symbols: tuple[str, ...] | None = None

    @classmethod
    def train(
        cls,
        sentences: Iterable[str],
        *,
        model_type: str = "bpe",
        vocab_size: int,
        character_coverage: float = 1.0,
        seed: int = 1,
        max_sentences: int = 2_000_000,
        user_symbols: Sequence[str] = (),
    ) -> SentencePieceTokenizer:
        """Trains a model on a stream of sentences.

        When the text supports fewer pieces than `vocab_size`, the vocabulary is lowered to
        what it supports and a warning is logged.

        Args:
            sentences: The training sentences. Streamed, never held in Python; it must be
                re-iterable (a list, or an object whose __iter__ restarts) in the rare case
                that sentencepiece rejects the vocabulary size and training must be repeated.
            model_type: "bpe" or "unigram".
            vocab_size: Wanted number of pieces, special pieces included.
            character_coverage: Share of characters the model must cover (1.0: all).
            seed: Seed of sentencepiece's random generator (sentence sampling).
            max_sentences: At most this many sentences, sampled uniformly from the stream,
                are used (<= 0: all of them; at least 101 otherwise).
            user_symbols: Strings that become pieces of their own (corpus tags), each one
                piece wherever it occurs.

        Raises:
            ValueError: On an unknown model type or a non-positive vocabulary size.
            DataError: When training is impossible with this data (no sentences, fewer pieces
                allowed than distinct characters, ...), or the stream raised DataError.
        """
        if model_type not in MODEL_TYPES:
            raise ValueError(f"unknown model_type {model_type!r}: expected one of {MODEL_TYPES}")
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be positive, got {vocab_size}")
        sampled = 0 if max_sentences <= 0 else max(max_sentences, _MIN_SAMPLED_SENTENCES)
        attempt_size = vocab_size
        # Passed only when there are any: a model without tags is trained as it always was.
        extra = {"user_defined_symbols": list(user_symbols)} if user_symbols else {}
        for attempt in range(2):
            feed = _SentenceFeed(sentences=sentences)
            writer = io.BytesIO()
            spm.set_random_generator_seed(seed)
            try:
                spm.SentencePieceTrainer.train(
                    sentence_iterator=feed,
                    model_writer=writer,
                    model_type=model_type,
                    vocab_size=attempt_size,
                    # A soft limit lets sentencepiece stop at what the text supports instead of
                    # failing; older BPE trainers ignore it, hence the retry below.
                    hard_vocab_limit=False,
                    character_coverage=character_coverage,
                    input_sentence_size=sampled,
                    shuffle_input_sentence=True,
                    pad_id=PAD_ID,
                    unk_id=UNK_ID,
                    bos_id=BOS_ID,
                    eos_id=EOS_ID,
                    pad_piece=PAD_PIECE,
                    unk_piece=UNK_PIECE,
                    bos_piece=BOS_PIECE,
                    eos_piece=EOS_PIECE,
                    num_threads=max(1, os.cpu_count() or 1),
                    minloglevel=2,
                    **extra,
                )
            except RuntimeError as error:
                if feed.error is not None:
                    raise feed.error from None
                if feed.count == 0:
                    raise DataError("cannot train a tokenizer: no training sentences") from None
                message = " ".join(str(error).split())
                too_high = _VOCAB_TOO_HIGH.search(message)
                if too_high is None or attempt > 0:
                    raise DataError(f"sentencepiece training failed: {message}") from None
                if iter(sentences) is sentences:
                    raise ValueError(
                        "sentencepiece needs a second pass to lower the vocabulary size, but the "
                        "sentences are a one-shot iterator; pass a re-iterable collection"
                    ) from None
                attempt_size = int(too_high.group(2))
                continue
            tokenizer = cls(model_proto=writer.getvalue())
            if tokenizer.vocab_size < vocab_size:
                logger.warning(
                    "vocabulary size lowered from %d to %d: the training text (%d sentences) "
                    "supports no more %s pieces",
                    vocab_size,
                    tokenizer.vocab_size,
                    feed.count,
                    model_type,
                )
            return tokenizer
        raise AssertionError("unreachable")  # pragma: no cover

    @classmethod
    def from_bytes(cls, model_proto: bytes) -> SentencePieceTokenizer:
        """Loads a model from its serialized bytes (see `to_bytes`)."""
        return cls(model_proto=model_proto)

    def to_bytes(self) -> bytes:
        """Returns the serialized model (the content of a .model file)."""
        return self._model_proto

    def save(self, path: Path) -> None:
        """Writes the model file (conventionally `.model`) atomically: a crash leaves no
        half-written file."""
        write_bytes(path, self._model_proto)

    @classmethod
    def load(cls, path: Path) -> SentencePieceTokenizer:
        """Reads a model file written by `save` (or by sentencepiece itself)."""
        return cls(model_proto=Path(path).read_bytes())

    @property
    def vocab_size(self) -> int:
        """Number of pieces, special pieces included."""
        return self._processor.get_piece_size()

    def encode(self, sentences: Sequence[str], *,
               sampling: SubwordSampling | None = None) -> list[list[int]]:
        """Encodes a batch of sentences to piece ids, without bos/eos.

        Args:
            sampling: Draw a segmentation instead of the best one (subword regularization,
                training only): sentencepiece's ``enable_sampling`` with ``alpha``, its
                generator seeded with ``seed`` first, so equal calls give equal pieces.

        A sentence that starts with a user-defined piece (a corpus tag) and a space encodes it
        as that one piece, as the tagged training sources were; sentencepiece alone would put
        a lone "▁" piece before it.

        Returns:
            One list of ids per sentence (empty for an empty or blank sentence).
        """
        if not sentences:
            return []
        options = {}
        if sampling is not None:
            # sentencepiece's generator, seeded per call; one thread, as its threads would
            # take the sentences in no fixed order, each with a generator of that seed.
            spm.set_random_generator_seed(sampling.seed)
            options = {"enable_sampling": True, "alpha": sampling.alpha, "nbest_size": -1,
                       "num_threads": 1}
        if not self.user_symbols:
            return self._processor.encode(list(sentences), out_type=int, **options)
        if self._leading_symbol is None:
            longest_first = sorted(self.user_symbols, key=len, reverse=True)
            self._leading_symbol = re.compile(
                r"\s*(" + "|".join(map(re.escape, longest_first)) + r")(?:\s+|$)")
        heads, rests = [], []
        for sentence in sentences:
            match = self._leading_symbol.match(sentence)
            heads.append(None if match is None else self._processor.piece_to_id(match[1]))
            rests.append(sentence if match is None else sentence[match.end():])
        encoded = self._processor.encode(rests, out_type=int, **options)
        return [ids if head is None else [head, *ids]
                for head, ids in zip(heads, encoded, strict=True)]

    @property
    def user_symbols(self) -> tuple[str, ...]:
        """The model's user-defined pieces (corpus tags; none for a model trained without)."""
        if self._user_symbols is None:
            model = self._parsed()
            user_defined = type(model).SentencePiece.USER_DEFINED
            self._user_symbols = tuple(
                piece.piece for piece in model.pieces if piece.type == user_defined)
        return self._user_symbols

    def _parsed(self):
        """The model's protobuf (it imports google.protobuf: only here, where it is needed)."""
        from sentencepiece import sentencepiece_model_pb2

        proto = sentencepiece_model_pb2.ModelProto()
        proto.ParseFromString(self._model_proto)
        return proto

    def decode(self, batch_ids: Sequence[Sequence[int]]) -> list[str]:
        """Decodes a batch of id sequences (lists, arrays or 1-D tensors) to one sentence each.

        Each sequence is cut at its first EOS_ID; PAD_ID and BOS_ID are skipped wherever they
        are, so decoder output can be passed as is.
        """
        cleaned = [[token for token in takewhile(lambda token: token != EOS_ID, map(int, ids))
                    if token not in (PAD_ID, BOS_ID)] for ids in batch_ids]
        if not cleaned:
            return []
        return self._processor.decode(cleaned)

    def decode_pieces(self, batch_pieces: Sequence[Sequence[str]]) -> list[str]:
        """Decodes a batch of piece sequences (another engine's output, e.g. CTranslate2's) to
        text."""
        return [self._processor.decode_pieces(list(pieces)) for pieces in batch_pieces]

    def id_to_piece(self, token_id: int) -> str:
        """Returns the piece of one id; IndexError outside the vocabulary."""
        return self._processor.id_to_piece(_checked_id(token_id, self.vocab_size))

    def pieces(self, ids: Iterable[int]) -> list[str]:
        """Returns the pieces of a sequence of ids (special pieces included, for display)."""
        return [self.id_to_piece(token_id) for token_id in ids]

    def normalize(self, sentence: str) -> str:
        """The sentence as the model segments it: normalized, each space written as "▁"."""
        return self._processor.normalize(sentence)

    def characters(self) -> frozenset[str]:
        """The characters that are pieces of their own; any other one encodes to UNK_ID."""
        processor = self._processor
        return frozenset(
            piece for token_id in range(self.vocab_size)
            if len(piece := processor.id_to_piece(token_id)) == 1
            and not (processor.is_control(token_id) or processor.is_unknown(token_id))
        )

    def with_characters(self, characters: Sequence[str]) -> SentencePieceTokenizer:
        """This model with `characters` appended as pieces (ids from `vocab_size` on, in order).

        No existing piece contains a character the model lacks, so a sentence without the new
        characters is segmented exactly as before (BPE merges and unigram paths alike) and the
        old ids keep their meaning. The new pieces score below every old one.

        Raises:
            ValueError: For a string that is not one character, or one already a piece.
        """
        if not characters:
            return self
        proto = self._parsed()
        known = set(self.characters())
        lowest = min(piece.score for piece in proto.pieces)
        for character in characters:
            if len(character) != 1 or character in known:
                raise ValueError(f"{character!r} is not one character the model lacks")
            known.add(character)
            proto.pieces.add(piece=character, score=lowest - 1.0,
                             type=type(proto).SentencePiece.NORMAL)
        return type(self)(model_proto=proto.SerializeToString())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"


class SubsetTokenizer:
    """A tokenizer whose ids cover only some pieces of another: the target side of a joint model.

    A joint vocabulary holds source-only pieces that a target sentence never uses; giving the
    output layer only the pieces seen in the training targets makes its matrix product (the
    largest one of a training step) proportionally cheaper. Ids are compact: kept piece i is
    number i of the special ids 0-3 (which keep their values) followed by `kept_ids` in the
    order given, and a piece outside the subset encodes to UNK_ID. Pruning keeps the base
    model's order; a fine-tuned model's extension appends its pieces after the parent's, so
    the parent's compact ids keep their meaning.

    Args:
        base: The full sentencepiece tokenizer.
        kept_ids: Base ids to keep, in compact order (the special ids are always kept, first).
    """

    def __init__(self, *, base: SentencePieceTokenizer, kept_ids: Iterable[int]) -> None:
        specials = np.array([PAD_ID, UNK_ID, BOS_ID, EOS_ID], dtype=np.int64)
        given = np.asarray(list(kept_ids), dtype=np.int64)
        given = given[~np.isin(given, specials)]
        _, first = np.unique(given, return_index=True)  # each id once, where it first occurs
        kept = np.concatenate([specials, given[np.sort(first)]])
        if kept.max() >= base.vocab_size or kept.min() < 0:
            raise ValueError(f"kept ids must lie in [0, {base.vocab_size})")
        self.base = base
        self.kept_ids = kept  # (K,) compact id -> base id
        self.to_compact = np.full(base.vocab_size, UNK_ID, dtype=np.int64)  # base id -> compact id
        self.to_compact[kept] = np.arange(len(kept))

    @property
    def vocab_size(self) -> int:
        return len(self.kept_ids)

    def encode(self, sentences: Sequence[str], *,
               sampling: SubwordSampling | None = None) -> list[list[int]]:
        lookup = self.to_compact
        return [lookup[ids].tolist() if ids else []
                for ids in self.base.encode(sentences, sampling=sampling)]

    def decode(self, batch_ids: Sequence[Sequence[int]]) -> list[str]:
        kept, size = self.kept_ids, self.vocab_size  # a negative id must not wrap around
        return self.base.decode([[int(kept[_checked_id(t, size)]) for t in ids]
                                 for ids in batch_ids])

    def decode_pieces(self, batch_pieces: Sequence[Sequence[str]]) -> list[str]:
        return self.base.decode_pieces(batch_pieces)

    def id_to_piece(self, token_id: int) -> str:
        return self.base.id_to_piece(int(self.kept_ids[_checked_id(token_id, self.vocab_size)]))

    def pieces(self, ids: Iterable[int]) -> list[str]:
        return [self.id_to_piece(token_id) for token_id in ids]

    def to_bytes(self) -> bytes:
        """The base model (the subset itself is stored next to it, as ``kept_ids``)."""
        return self.base.to_bytes()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size} of {self.base.vocab_size})"


@dataclass(frozen=True, kw_only=True)
class Tokenizers:
    """The tokenizer(s) of a language pair: one shared model, or one per side.

    Attributes:
        tgt: When joint, `src` itself or a SubsetTokenizer of it.
        joint: Whether one model serves both sides.
    """

    src: SentencePieceTokenizer
    tgt: SentencePieceTokenizer | SubsetTokenizer
    joint: bool

    @classmethod
    def of(cls, src: SentencePieceTokenizer, tgt: SentencePieceTokenizer | None = None, *,
           kept_ids: Iterable[int] | None = None) -> Tokenizers:
        """One shared model (`tgt` None: joint) or one a side; with `kept_ids`, the target side
        is the SubsetTokenizer of those ids of its model."""
        target = src if tgt is None else tgt
        if kept_ids is not None:
            target = SubsetTokenizer(base=target, kept_ids=kept_ids)
        return cls(src=src, tgt=target, joint=tgt is None)

    @property
    def target_model(self) -> SentencePieceTokenizer:
        """The target side's whole sentencepiece model (the base of a pruned one)."""
        return self.tgt.base if isinstance(self.tgt, SubsetTokenizer) else self.tgt

    @property
    def target_ids(self) -> np.ndarray:
        """The target model's id of each output id: a pruned target's ``kept_ids``, else all."""
        if isinstance(self.tgt, SubsetTokenizer):
            return self.tgt.kept_ids
        return np.arange(self.tgt.vocab_size)
