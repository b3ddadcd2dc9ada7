"""Training a build's sentencepiece model(s) on the training corpora, streamed from disk."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

from seq2seq.console import count_bar
from seq2seq.data.settings import TokenizerSettings
from seq2seq.data.text_files import iter_parallel_chunks
from seq2seq.data.tokenizer import SentencePieceTokenizer, Tokenizers

logger = logging.getLogger(__name__)


class _TrainingSentences:
    """Re-iterable stream of the non-empty training pairs' sentences, read from disk.

    Re-iterable so that sentencepiece training can be repeated (see
    SentencePieceTokenizer.train) without holding the corpus in memory.
    """

    def __init__(
        self, *, files: Sequence[tuple[Path, Path]], sides: tuple[str, ...],
        progress: bool | None
    ) -> None:
        self._files = list(files)
        self._sides = sides
        self._progress = progress

    def __iter__(self) -> Iterator[str]:
        use_src = "src" in self._sides
        use_tgt = "tgt" in self._sides
        sides = "+".join(self._sides)
        with count_bar(None, description=f"reading train ({sides}) for the tokenizer",
                       unit=" pairs", unit_scale=True, enabled=self._progress) as bar:
            for src_path, tgt_path in self._files:
                for src_chunk, tgt_chunk in iter_parallel_chunks(src_path, tgt_path):
                    for src, tgt in zip(src_chunk, tgt_chunk, strict=True):
                        # Pairs the filter drops for being empty must not shape the vocabulary.
                        if src.strip() and tgt.strip():
                            if use_src:
                                yield src
                            if use_tgt:
                                yield tgt
                    bar.update(len(src_chunk))


def train_tokenizers(
    *,
    train_files: Sequence[tuple[Path, Path]],
    settings: TokenizerSettings,
    progress: bool | None,
    tags: Sequence[str] = (),
) -> Tokenizers:
    """Trains one joint model on both sides, or one model per side, as `settings` say.

    Every corpus counts once per pair, whatever its weight: weights decide what training
    draws, not the vocabulary.

    Args:
        train_files: (source file, target file) of each training corpus.
        progress: Show progress bars (None: only when stderr is a terminal).
        tags: Corpus tags: user-defined pieces of the model that encodes sources.

    Raises:
        DataError: On unreadable training data or when sentencepiece cannot train on it.
    """
    folders = ", ".join(dict.fromkeys(str(src.parent) for src, _ in train_files))

    def train(sides: tuple[str, ...]) -> SentencePieceTokenizer:
        logger.info(
            "training a %s tokenizer (%s) on %s",
            settings.model_type,
            "+".join(sides),
            folders,
        )
        return SentencePieceTokenizer.train(
            _TrainingSentences(files=train_files, sides=sides, progress=progress),
            model_type=settings.model_type,
            vocab_size=settings.vocab_size,
            character_coverage=settings.character_coverage,
            seed=settings.seed,
            max_sentences=settings.max_training_sentences,
            user_symbols=tags if "src" in sides else (),
        )

    if settings.joint:
        return Tokenizers.of(train(("src", "tgt")))
    return Tokenizers.of(train(("src",)), train(("tgt",)))
