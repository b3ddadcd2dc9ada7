"""Subword regularization: the training pairs segmented anew for every epoch (BPE-dropout,
Provilkov et al., 2020; subword sampling, Kudo, 2018). The method, why the whole epoch is drawn
before batching, and the target drawn with ``<unk>`` that keeps its stored segmentation:
docs/training.md#subword-regularization.

:class:`SampledPairs` wraps the stored training pairs. At the start of an epoch it decodes them
back to their (normalized) text and encodes them with sampling, in chunks, sentencepiece's
generator seeded by the run's seed, the epoch and the chunk. A sentence drawn longer than the
data stage's length filter (``data.filter.max_length``) keeps its stored segmentation too, so
the model trains on no longer sentences than it was prepared for (the location scorer's window,
for one).
"""

from __future__ import annotations

import numpy as np

from seq2seq.data.dataset import ParallelDataset, TokenArray
from seq2seq.data.tokenizer import SubwordSampling, Tokenizers
from seq2seq.data.vocab import UNK_ID

# Sentences encoded under one seed (a draw of the whole epoch is many such calls).
_CHUNK = 2000


class SampledPairs(ParallelDataset):
    """The training pairs with a segmentation drawn for each epoch.

    Args:
        pairs: The stored (best) segmentation of the training pairs.
        alpha: sentencepiece's sampling parameter (:class:`SubwordSampling`), in (0, 1].
        max_length: The most pieces a drawn sentence may have (``data.filter.max_length``);
            a longer draw keeps the stored pieces. None: no limit.

    ``set_epoch`` draws an epoch (epoch 0 on construction); ``src`` and ``tgt``, so the lengths
    and items, are then that draw's, held in memory (the token ids of the corpus, 2 bytes a
    piece).
    """

    same_each_epoch = False

    def __init__(self, pairs: ParallelDataset, tokenizers: Tokenizers, *, alpha: float,
                 seed: int, max_length: int | None = None) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"subword sampling alpha must be in (0, 1], got {alpha}")
        self.pairs = pairs
        self.tokenizers = tokenizers
        self.alpha = float(alpha)
        self.seed = int(seed)
        self.max_length = max_length
        self.epoch: int | None = None
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        """Draws the segmentation of ``epoch`` (nothing to do if it is the current one)."""
        if epoch == self.epoch:
            return
        self.src = self._draw(self.pairs.src, self.tokenizers.src, epoch, side=0)
        self.tgt = self._draw(self.pairs.tgt, self.tokenizers.tgt, epoch, side=1)
        self.epoch = epoch

    def _draw(self, stored: TokenArray, tokenizer, epoch: int, *, side: int) -> TokenArray:
        drawn: list[np.ndarray] = []
        for start in range(0, len(stored), _CHUNK):
            best = [stored[index] for index in range(start, min(start + _CHUNK, len(stored)))]
            seed = int(np.random.default_rng([self.seed, epoch, side, start]).integers(2**31))
            sampled = tokenizer.encode(tokenizer.decode(best),
                                       sampling=SubwordSampling(self.alpha, seed))
            drawn.extend(self._checked(ids, kept)
                         for ids, kept in zip(sampled, best, strict=True))
        lengths = np.array([len(ids) for ids in drawn], dtype=np.int64)
        tokens = np.concatenate(drawn) if drawn else np.zeros(0, dtype=np.uint16)
        return TokenArray(tokens=tokens.astype(np.uint16 if tokens.max(initial=0) < 65535
                                               else np.int32),
                          offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))

    def _checked(self, ids: list[int], stored: np.ndarray) -> np.ndarray:
        """The drawn ids, or the stored ones where the draw reads ``<unk>`` and they do not
        (a piece outside a pruned output layer), or is longer than ``max_length``."""
        drawn = np.asarray(ids, dtype=np.int64)
        if ((drawn == UNK_ID).any() and not (stored == UNK_ID).any()) or (
                self.max_length is not None and len(drawn) > self.max_length):
            return np.asarray(stored, dtype=np.int64)
        return drawn


def sampled_training_pairs(pairs: ParallelDataset, tokenizers: Tokenizers, *, alpha: float,
                           seed: int, max_length: int | None = None
                           ) -> ParallelDataset | SampledPairs:
    """``pairs`` with subword sampling at ``alpha`` (``trainer.subword_sampling``), no draw
    longer than ``max_length`` pieces; 0: as stored."""
    if alpha == 0:
        return pairs
    return SampledPairs(pairs, tokenizers, alpha=alpha, seed=seed, max_length=max_length)
