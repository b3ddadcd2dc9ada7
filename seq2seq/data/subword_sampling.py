"""Subword regularization: the training pairs segmented anew for every batch.

A model trained on one segmentation of each word learns that segmentation; drawn anew for each
batch (BPE-dropout for a bpe model, subword sampling for a unigram one, both sentencepiece's
own ``enable_sampling``), it sees the same words cut in many ways, which regularizes it much as
more data would (Kudo, 2018; Provilkov et al., 2020). Validation, test and translation keep the
best segmentation.

:class:`SampledPairs` wraps the stored training pairs: a batch's sentences are decoded back to
their (normalized) text and encoded with sampling, sentencepiece's generator seeded by the run's
seed and the batch's indices. So a batch reads the same pieces in whichever process builds it (a
DataLoader worker, a rank) and in a resumed run, and differs from epoch to epoch because
batches hold other pairs then. Where ours differs from plain sentencepiece sampling: a target
sentence drawn with a piece outside the output layer (a pruned joint vocabulary) keeps its
stored segmentation, so the model never learns to write ``<unk>``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from seq2seq.data.dataset import IndexedSamples, ParallelDataset
from seq2seq.data.tokenizer import SubwordSampling, Tokenizers
from seq2seq.data.vocab import UNK_ID

# Sentences drawn once at the start to measure how much longer sampled segmentations are.
_LENGTH_SAMPLE = 2000


class SampledPairs:
    """The training pairs with a segmentation drawn for each batch; a map-style dataset.

    Args:
        pairs: The stored (best) segmentation of the training pairs.
        tokenizers: The run's tokenizers.
        alpha: sentencepiece's sampling parameter (:class:`SubwordSampling`), in (0, 1].
        seed: The run's seed.

    The lengths that batching reads (``src_lengths``, ``tgt_lengths``) are the stored ones
    scaled by how much longer the sampled segmentations of a fixed sample came out, so that a
    batch keeps about ``batch.max_tokens`` tokens.
    """

    def __init__(self, pairs: ParallelDataset, tokenizers: Tokenizers, *, alpha: float,
                 seed: int) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"subword sampling alpha must be in (0, 1], got {alpha}")
        self.pairs = pairs
        self.tokenizers = tokenizers
        self.alpha = float(alpha)
        self.seed = int(seed)
        self.src_lengths, self.tgt_lengths = self._expected_lengths()

    def _expected_lengths(self) -> tuple[np.ndarray, np.ndarray]:
        sample = list(range(0, len(self.pairs), max(1, len(self.pairs) // _LENGTH_SAMPLE)))
        drawn = self.__getitems__(sample)
        lengths = []
        for side, stored in enumerate((self.pairs.src_lengths, self.pairs.tgt_lengths)):
            ratio = (sum(len(pair[side]) for pair in drawn)
                     / max(int(stored[sample].sum()), 1))
            lengths.append(np.ceil(stored * ratio).astype(np.int32))
        return lengths[0], lengths[1]

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> IndexedSamples:
        """The pairs at ``indices``, each side segmented by a draw seeded by the indices."""
        stored = self.pairs.__getitems__(list(indices))
        seeds = np.random.default_rng([self.seed, *map(int, indices)]).integers(2**31, size=2)
        sides = []
        for side, (tokenizer, seed) in enumerate(
                zip((self.tokenizers.src, self.tokenizers.tgt), seeds, strict=True)):
            best = [pair[side] for pair in stored]
            drawn = tokenizer.encode(tokenizer.decode(best),
                                     sampling=SubwordSampling(self.alpha, int(seed)))
            sides.append([self._checked(ids, fallback)
                          for ids, fallback in zip(drawn, best, strict=True)])
        return IndexedSamples(list(zip(*sides, strict=True)), indices=list(indices))

    @staticmethod
    def _checked(ids: list[int], stored: np.ndarray) -> np.ndarray:
        """The drawn ids, or the stored ones where the draw reads ``<unk>`` and they do not
        (a piece outside a pruned output layer)."""
        drawn = np.asarray(ids, dtype=stored.dtype)
        if (drawn == UNK_ID).any() and not (stored == UNK_ID).any():
            return stored
        return drawn


def sampled_training_pairs(pairs: ParallelDataset, tokenizers: Tokenizers, *, alpha: float,
                           seed: int) -> ParallelDataset | SampledPairs:
    """``pairs`` with subword sampling at ``alpha`` (``trainer.subword_sampling``); 0: as
    stored."""
    if alpha == 0:
        return pairs
    return SampledPairs(pairs, tokenizers, alpha=alpha, seed=seed)
