"""Drawing an epoch's training pairs from several corpora in proportion to their weights.

How the weights are honoured (quotas, endless shuffled passes, the same draw on every rank and
on resuming): docs/your-data.md#several-corpora. The corpora lie one after another in the
training split; corpus i's quota is ``total * weight_i / sum(weights)``, rounded by largest
remainder so that the quotas add up, and the draw depends only on (seed, epoch, corpus).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Keeps the passes' random streams apart from the sampler's (seed, epoch) stream.
_PASS_STREAM = 0x636F7270


@dataclass(frozen=True)
class CorpusMix:
    """The training split's corpora: their names, sizes in dataset order, and weights."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.sizes) == len(self.weights) >= 1:
            raise ValueError("a mix needs one name, size and weight per corpus, and a corpus")
        if min(self.sizes) < 1:
            raise ValueError(f"every corpus needs a pair to draw from, got sizes {self.sizes}")
        if min(self.weights) <= 0:
            raise ValueError(f"weights must be positive, got {self.weights}")

    def __len__(self) -> int:
        return len(self.names)

    @property
    def total(self) -> int:
        """Pairs of all corpora together: the pairs of an epoch."""
        return int(sum(self.sizes))

    @property
    def starts(self) -> np.ndarray:
        """Dataset index of each corpus's first pair."""
        return np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)

    @property
    def shares(self) -> np.ndarray:
        """Each corpus's wanted share of the pairs drawn."""
        weights = np.asarray(self.weights, dtype=np.float64)
        return weights / weights.sum()

    def quotas(self) -> np.ndarray:
        """Pairs drawn from each corpus per epoch; they add up to `total`."""
        exact = self.shares * self.total
        quotas = np.floor(exact).astype(np.int64)
        missing = self.total - int(quotas.sum())
        by_remainder = np.argsort(-(exact - quotas), kind="stable")
        quotas[by_remainder[:missing]] += 1
        return quotas

    def epoch_indices(self, *, seed: int, epoch: int) -> np.ndarray:
        """The dataset indices of an epoch's pairs, grouped by corpus (the sampler shuffles)."""
        drawn = []
        for corpus, (start, size, quota) in enumerate(
            zip(self.starts, self.sizes, self.quotas(), strict=True)
        ):
            first = epoch * int(quota)  # position in the corpus's endless sequence of passes
            end = first + int(quota)
            for number in range(first // size, -(-end // size)):
                order = np.random.default_rng([seed, _PASS_STREAM, corpus, number]).permutation(size)
                low, high = max(first - number * size, 0), min(end - number * size, size)
                drawn.append(order[low:high] + start)
        return np.concatenate(drawn) if drawn else np.zeros(0, dtype=np.int64)

    def corpus_of(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """The corpus (position in the mix) of each dataset index."""
        return np.searchsorted(self.starts, np.asarray(indices), side="right") - 1


class PairsSeen:
    """Counts the training pairs taken from each corpus, for the log's shares."""

    def __init__(self, mix: CorpusMix) -> None:
        self.mix = mix
        self.counts = np.zeros(len(mix), dtype=np.int64)

    def add(self, indices: Sequence[int] | np.ndarray) -> None:
        """Counts one batch by the dataset indices of its pairs."""
        self.counts += np.bincount(self.mix.corpus_of(indices), minlength=len(self.mix))

    def describe(self, counts: Sequence[int]) -> str:
        """``a 74.8 %, bt 25.2 %``: each corpus's share of `counts` (all ranks' counts)."""
        counts = np.asarray(counts, dtype=np.float64)
        shares = 100 * counts / max(counts.sum(), 1)
        return ", ".join(f"{name} {share:.1f} %"
                         for name, share in zip(self.mix.names, shares, strict=True))
