"""Token-budget batching: length-bucketed, reproducibly shuffled, resumable and shardable.

A pair's cost is its longer side plus one (the eos appended to the source, the bos/eos added
to the target), and a batch's cost is its number of pairs times its largest pair cost, i.e.
the size of its padded source or target tensor, whichever is bigger.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from seq2seq.data.mixing import CorpusMix
from seq2seq.data.vocab import BOS_ID, EOS_ID, PAD_ID

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class Batch:
    """A padded batch of sentence pairs, ready for teacher forcing.

    Attributes:
        src: (B, S) int64 source ids followed by EOS_ID, padded with PAD_ID.
        src_lengths: (B,) int64 source lengths including the eos; left on the CPU by
            :meth:`to` (the encoders move them to the source's device themselves).
        tgt_in: (B, T) int64 decoder input: BOS_ID then the target ids, padded.
        tgt_out: (B, T) int64 decoder output: the target ids then EOS_ID, padded.
        indices: (B,) int64 dataset index of each row (to put translations back in order).
        num_tgt_tokens: Number of non-pad entries of tgt_out (for loss normalization).
    """

    src: torch.Tensor
    src_lengths: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    indices: torch.Tensor
    num_tgt_tokens: int

    def __len__(self) -> int:
        return self.src.shape[0]

    def _map_tensors(self, function: Callable[[torch.Tensor], torch.Tensor], *,
                     skip: tuple[str, ...] = ()) -> Batch:
        """A copy with `function` applied to each tensor, in field order, but those in `skip`."""
        return replace(self, **{
            field.name: function(getattr(self, field.name)) for field in fields(self)
            if isinstance(getattr(self, field.name), torch.Tensor) and field.name not in skip
        })

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> Batch:
        """Returns a copy whose tensors are on `device`, except src_lengths (left as they are);
        `non_blocking` is passed to Tensor.to (useful with pinned memory)."""
        return self._map_tensors(lambda tensor: tensor.to(device, non_blocking=non_blocking),
                                 skip=("src_lengths",))

    def pin_memory(self) -> Batch:
        """Returns a copy in pinned memory (called by DataLoader(pin_memory=True))."""
        return self._map_tensors(torch.Tensor.pin_memory)


def pad_sources(sources: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """Source id arrays (without EOS) as one padded batch, each followed by EOS_ID.

    Shape:
        - output: src (B, S) int64 padded with PAD_ID, S = longest + 1; src_lengths (B,)
          int64, EOS included
    """
    lengths = np.fromiter((len(ids) for ids in sources), dtype=np.int64, count=len(sources)) + 1
    src = np.full((len(sources), int(lengths.max())), PAD_ID, dtype=np.int64)
    for row, ids in enumerate(sources):
        src[row, : len(ids)] = ids
        src[row, len(ids)] = EOS_ID
    return torch.from_numpy(src), torch.from_numpy(lengths)


def collate(
    samples: Sequence[tuple[np.ndarray, np.ndarray]], indices: Sequence[int] | None = None
) -> Batch:
    """Pads a list of (source ids, target ids) pairs into a Batch.

    Usable directly as a DataLoader `collate_fn` with a ParallelDataset and a batch sampler:
    the dataset's `__getitems__` then hands over the indices with the samples.

    Args:
        samples: Pairs of 1-D integer arrays of piece ids, without bos/eos.
        indices: The dataset index of each pair. When None, they are taken from
            `samples.indices` (see ParallelDataset.__getitems__), or set to -1 (unknown).

    Raises:
        ValueError: If there are no samples or the number of indices differs.
    """
    if indices is None:
        indices = getattr(samples, "indices", None)
        if indices is None:
            indices = [-1] * len(samples)
    size = len(samples)
    if size == 0:
        raise ValueError("cannot collate an empty batch")
    if len(indices) != size:
        raise ValueError(f"got {size} samples but {len(indices)} indices")
    src, src_lengths = pad_sources([src_ids for src_ids, _ in samples])
    tgt_lengths = np.fromiter((len(tgt) for _, tgt in samples), dtype=np.int64, count=size) + 1
    tgt_in = np.full((size, int(tgt_lengths.max())), PAD_ID, dtype=np.int64)
    tgt_out = np.full_like(tgt_in, PAD_ID)
    for row, (_, tgt_ids) in enumerate(samples):
        tgt_length = len(tgt_ids)
        tgt_in[row, 0] = BOS_ID
        tgt_in[row, 1 : tgt_length + 1] = tgt_ids
        tgt_out[row, :tgt_length] = tgt_ids
        tgt_out[row, tgt_length] = EOS_ID
    return Batch(
        src=src,
        src_lengths=src_lengths,
        tgt_in=torch.from_numpy(tgt_in),
        tgt_out=torch.from_numpy(tgt_out),
        indices=torch.as_tensor(np.asarray(indices, dtype=np.int64)),
        num_tgt_tokens=int(tgt_lengths.sum()),
    )


def cut_sorted(
    indices: np.ndarray, costs: np.ndarray, *, max_tokens: int, max_sentences: int
) -> list[np.ndarray]:
    """Greedily cuts items sorted by ascending cost into batches within the token budget
    (the padded size: a batch's count times its largest cost).

    With ascending costs the padded size of a batch starting at i and holding c pairs is
    c * costs[i + c - 1], which grows with c, so the largest c under the budget is found by
    binary search instead of a Python loop over every pair.
    """
    batches = []
    start, total = 0, len(indices)
    while start < total:
        upper = min(total - start, max_sentences, max(1, max_tokens // int(costs[start])))
        padded = np.arange(1, upper + 1, dtype=np.int64) * costs[start : start + upper]
        count = max(1, int(np.searchsorted(padded, max_tokens, side="right")))
        batches.append(indices[start : start + count])
        start += count
    return batches


def _integer_array(values: Any) -> np.ndarray:
    """``values`` as int32 or int64 without a copy where it already is one, else as int64."""
    array = np.asarray(values)
    return array if array.dtype in (np.int32, np.int64) else array.astype(np.int64)


def _index_dtype(count: int) -> type:
    return np.int32 if count < 2**31 else np.int64


class TokenBucketSampler(Sampler[list[int]]):
    """Yields batches of dataset indices under a token budget, with low padding.

    Training mode (shuffle=True), for each epoch: the indices (with several corpora, those
    `CorpusMix.epoch_indices` draws in proportion to their weights) are shuffled with a
    generator seeded by (seed, epoch); consecutive windows of `bucket_size` batches' worth of
    pairs are sorted by length and cut into batches (so a batch holds pairs of similar length while
    which pairs meet is random); the batch order is shuffled. The global batch list is then
    dealt round robin to the `world_size` ranks, dropping the last len % world_size batches
    so that every rank gets the same number (the dropped ones change every epoch).

    Inference mode (shuffle=False): all pairs sorted by length, batches in that order, dealt
    round robin without dropping anything (ranks may then differ by one batch).

    The sampler remembers how many batches of the current epoch it has handed out, so a
    checkpointed `state_dict()` resumes mid-epoch with exactly the remaining batches.
    """

    def __init__(
        self,
        *,
        src_lengths: np.ndarray,
        tgt_lengths: np.ndarray,
        max_tokens: int,
        max_sentences: int | None = None,
        bucket_size: int = 100,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        mix: CorpusMix | None = None,
    ) -> None:
        """A sampler over the pairs whose lengths are given (``rank`` of ``world_size``).

        Args:
            src_lengths: Source pieces per pair, without eos.
            tgt_lengths: Target pieces per pair, without bos/eos.
            max_tokens: Budget per batch: pairs times the longest (length + 1) in the batch,
                either side. A single pair over budget still gets a batch of its own.
            max_sentences: Optional cap on pairs per batch.
            bucket_size: Batches' worth of pairs sorted together (training mode). Larger means
                less padding but less random batch composition.
            shuffle: Training mode (True) or length-sorted inference mode (False).
            seed: Seed of all shuffling; the same on every rank.
            mix: The corpora the pairs come from, one after another (training mode draws
                each epoch from them by weight); None or a single corpus: every pair once
                an epoch.

        Raises:
            ValueError: On inconsistent lengths or out-of-range settings.
        """
        super().__init__()
        self._costs: np.ndarray | None = None
        self.set_lengths(src_lengths, tgt_lengths)
        src = self._src_lengths
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        if max_sentences is not None and max_sentences < 1:
            raise ValueError(f"max_sentences must be positive or None, got {max_sentences}")
        if bucket_size < 1:
            raise ValueError(f"bucket_size must be positive, got {bucket_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(
                f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}"
            )
        if seed < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        if mix is not None and mix.total != len(src):
            raise ValueError(f"the corpora hold {mix.total} pairs, the lengths {len(src)}")
        self.max_tokens = int(max_tokens)
        self.max_sentences = max_sentences
        self.bucket_size = int(bucket_size)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.rank = rank
        self.world_size = world_size
        # One corpus is drawn as it always was: every pair once an epoch.
        self.mix = mix if mix is not None and len(mix) > 1 else None
        self.epoch = 0
        self._consumed = 0
        self._resume_from = 0

    def set_lengths(self, src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> None:
        """The pairs' lengths from now on (a training set segmented anew each epoch changes
        them; the number of pairs stays). Arguments as in the constructor."""
        # The lengths' own integer type (int32 from a TokenArray): an int64 copy of every
        # length would add 8 bytes a pair.
        src = _integer_array(src_lengths)
        tgt = _integer_array(tgt_lengths)
        if src.ndim != 1 or src.shape != tgt.shape:
            raise ValueError(
                f"lengths must be 1-D and equal in size, got {src.shape} and {tgt.shape}"
            )
        if self._costs is not None and len(src) != len(self._costs):
            raise ValueError(f"{len(src)} lengths for {len(self._costs)} pairs")
        self._src_lengths = src
        self._tgt_lengths = tgt
        self._costs = np.maximum(src, tgt) + 1
        self._cached_epoch: int | None = None
        self._cached_batches: list[np.ndarray] = []

    def _sort_order(self, indices: np.ndarray) -> np.ndarray:
        """Orders indices by cost, then source and target length (stable, so deterministic)."""
        order = np.lexsort(
            (self._tgt_lengths[indices], self._src_lengths[indices], self._costs[indices])
        )
        return indices[order]

    def _global_batches(self, epoch: int) -> list[np.ndarray]:
        """All ranks' batches of an epoch, in order (cached for the current epoch)."""
        if self._cached_epoch == epoch:
            return self._cached_batches
        count = len(self._costs)
        cap = self.max_sentences if self.max_sentences is not None else max(count, 1)
        if count == 0:
            windows: list[np.ndarray] = []
        elif not self.shuffle:
            windows = [np.arange(count)]  # inference: all pairs sorted by length at once
        else:
            generator = np.random.default_rng([self.seed, epoch])
            if self.mix is None:
                # The batches keep these indices all epoch: 4 bytes a pair where 2**31 allows.
                permutation = generator.permutation(count).astype(_index_dtype(count))
                mean_cost = float(self._costs.mean())
            else:
                drawn = self.mix.epoch_indices(seed=self.seed, epoch=epoch)
                permutation = drawn[generator.permutation(len(drawn))].astype(_index_dtype(count))
                mean_cost = float(self._costs[drawn].mean())
            pairs_per_batch = min(cap, max(1, int(self.max_tokens / mean_cost)))
            window = self.bucket_size * pairs_per_batch
            windows = [permutation[start : start + window]
                       for start in range(0, len(permutation), window)]
        batches: list[np.ndarray] = []
        for indices in windows:
            ordered = self._sort_order(indices)
            batches.extend(cut_sorted(ordered, self._costs[ordered], max_tokens=self.max_tokens,
                                      max_sentences=cap))
        if self.shuffle and batches:
            batches = [batches[position] for position in generator.permutation(len(batches))]
        self._cached_epoch = epoch
        self._cached_batches = batches
        return batches

    def _rank_batches(self) -> list[np.ndarray]:
        batches = self._global_batches(self.epoch)
        if self.world_size == 1:
            return batches
        if not self.shuffle:
            return batches[self.rank :: self.world_size]
        if 0 < len(batches) < self.world_size:
            # Too few batches for every rank: repeat some rather than leave a rank idle.
            logger.warning(
                "only %d batches for %d ranks: some batches are repeated",
                len(batches),
                self.world_size,
            )
            batches = [batches[position % len(batches)] for position in range(self.world_size)]
        per_rank = len(batches) // self.world_size
        return batches[self.rank : per_rank * self.world_size : self.world_size]

    def set_epoch(self, epoch: int, *, position: int = 0) -> None:
        """Selects the epoch (and so the shuffle) of the next iteration; ``position``: batches
        of this epoch already consumed (this rank's count), which the next iteration skips."""
        if epoch < 0:
            raise ValueError(f"epoch must be non-negative, got {epoch}")
        if position < 0:
            raise ValueError(f"position must be non-negative, got {position}")
        self.epoch = int(epoch)
        self._consumed = int(position)
        self._resume_from = int(position)

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._rank_batches()
        start = self._resume_from
        self._resume_from = 0
        self._consumed = start
        for batch in batches[start:]:
            self._consumed += 1
            yield batch.tolist()

    def __len__(self) -> int:
        """Number of batches this rank gets in the current epoch.

        It can differ slightly from epoch to epoch (windows hold different pairs), but is the
        same on every rank.
        """
        return len(self._rank_batches())

    def state_dict(self, *, batches_consumed: int | None = None) -> dict[str, int]:
        """Returns the position in the epoch, for checkpoints.

        Args:
            batches_consumed: Batches of this epoch actually trained on. By default the number
                the sampler has handed out, which runs ahead of training when a DataLoader
                prefetches (num_workers > 0); pass the trainer's own count then.

        Returns:
            {"seed", "epoch", "batches_consumed", "world_size"}.
        """
        consumed = self._consumed if batches_consumed is None else int(batches_consumed)
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "batches_consumed": consumed,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores a `state_dict`: the next iteration yields the rest of that epoch's batches.

        Raises:
            ValueError: If the state was saved with a different number of ranks (the per-rank
                position would then mean other batches).
        """
        saved_world_size = int(state.get("world_size", self.world_size))
        if saved_world_size != self.world_size:
            raise ValueError(
                f"sampler state was saved with world_size={saved_world_size}, "
                f"cannot resume with world_size={self.world_size}"
            )
        if int(state["seed"]) != self.seed:
            logger.warning(
                "resuming the sampler with its saved seed %d (configured: %d)",
                state["seed"],
                self.seed,
            )
        self.seed = int(state["seed"])
        self._cached_epoch = None  # cached under the old seed
        self.set_epoch(int(state["epoch"]), position=int(state["batches_consumed"]))
