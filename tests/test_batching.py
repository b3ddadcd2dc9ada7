"""TokenBucketSampler, collate and Batch: coverage, budgets, reproducibility, resume, shards."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from seq2seq.data.batching import Batch, TokenBucketSampler, collate
from seq2seq.data.dataset import ParallelDataset, TokenArrayWriter
from seq2seq.data.vocab import BOS_ID, EOS_ID, PAD_ID

MAX_TOKENS = 400


def _skewed_lengths(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Mostly short pairs with a long tail, target roughly as long as the source."""
    rng = np.random.default_rng(seed)
    src = np.clip(rng.lognormal(mean=2.5, sigma=0.7, size=count), 1, 150).astype(np.int64)
    tgt = np.clip(src + rng.integers(-3, 4, size=count), 0, None)
    return src, tgt


def _sampler(src: np.ndarray, tgt: np.ndarray, **options) -> TokenBucketSampler:
    settings = {"max_tokens": MAX_TOKENS, "bucket_size": 10, "seed": 3}
    settings.update(options)
    return TokenBucketSampler(src_lengths=src, tgt_lengths=tgt, **settings)


def _padding_fraction(batches: list[list[int]], src: np.ndarray, tgt: np.ndarray) -> float:
    """Share of padding in the source and target-output tensors of index batches."""
    padded = real = 0
    for batch in batches:
        src_sizes, tgt_sizes = src[batch] + 1, tgt[batch] + 1  # eos on the source, bos/eos
        padded += len(batch) * (int(src_sizes.max()) + int(tgt_sizes.max()))
        real += int(src_sizes.sum()) + int(tgt_sizes.sum())
    return (padded - real) / padded


def _epoch(sampler: TokenBucketSampler, epoch: int) -> list[list[int]]:
    sampler.set_epoch(epoch)
    return list(sampler)


def test_every_pair_exactly_once_per_epoch() -> None:
    src, tgt = _skewed_lengths(3000)
    sampler = _sampler(src, tgt)
    for epoch in range(2):
        batches = _epoch(sampler, epoch)
        assert len(batches) == len(sampler)
        flat = [index for batch in batches for index in batch]
        assert sorted(flat) == list(range(3000))


def test_token_budget_and_max_sentences() -> None:
    src, tgt = _skewed_lengths(2000)
    src[17] = 900  # alone over budget: still gets a batch of its own
    for options in ({}, {"max_sentences": 8}, {"shuffle": False}):
        sampler = _sampler(src, tgt, **options)
        batches = _epoch(sampler, 0)
        for batch in batches:
            longest = max(max(src[i], tgt[i]) + 1 for i in batch)
            assert len(batch) * longest <= MAX_TOKENS or len(batch) == 1
            assert len(batch) <= options.get("max_sentences", len(batch))
        assert [17] in batches


def test_same_seed_same_batches_other_epoch_or_seed_other_order() -> None:
    src, tgt = _skewed_lengths(2000)
    first = _epoch(_sampler(src, tgt), 4)
    assert _epoch(_sampler(src, tgt), 4) == first
    assert _epoch(_sampler(src, tgt), 5) != first
    assert _epoch(_sampler(src, tgt, seed=4), 4) != first
    # Batch order is shuffled and so is composition: not merely the same batches reordered.
    assert sorted(map(tuple, _epoch(_sampler(src, tgt), 5))) != sorted(map(tuple, first))


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.uint16])
def test_the_lengths_integer_type_changes_no_batch(dtype) -> None:
    """int32 lengths (a dataset's) are kept as they are; narrower ones are widened."""
    src, tgt = _skewed_lengths(2000)
    src, tgt = np.minimum(src, 255), np.minimum(tgt, 255)  # within uint8
    src[:5] = 255  # a cost of 256 would wrap around to 0 in uint8
    for shuffle in (True, False):
        expected = _epoch(_sampler(src, tgt, shuffle=shuffle), 2)
        narrow = _sampler(src.astype(dtype), tgt.astype(dtype), shuffle=shuffle)
        assert _epoch(narrow, 2) == expected


def test_resume_mid_epoch_continues_with_the_same_batches() -> None:
    src, tgt = _skewed_lengths(2000)
    sampler = _sampler(src, tgt)
    sampler.set_epoch(2)
    expected = list(sampler)
    sampler.set_epoch(2)
    iterator = iter(sampler)
    seen = [next(iterator) for _ in range(7)]
    state = sampler.state_dict()
    assert state["epoch"] == 2 and state["batches_consumed"] == 7 and state["seed"] == 3

    resumed = _sampler(src, tgt)
    resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
    assert seen + list(resumed) == expected
    # After the resumed epoch, the next epoch starts from its beginning.
    assert _epoch(resumed, 3) == _epoch(_sampler(src, tgt), 3)


def test_resume_through_set_epoch_position_and_explicit_count() -> None:
    src, tgt = _skewed_lengths(1500)
    expected = _epoch(_sampler(src, tgt), 1)
    sampler = _sampler(src, tgt)
    sampler.set_epoch(1, position=5)
    assert list(sampler) == expected[5:]
    # A prefetching DataLoader runs ahead of training: the trainer's own count wins.
    sampler.set_epoch(1)
    iterator = iter(sampler)
    for _ in range(9):
        next(iterator)
    state = sampler.state_dict(batches_consumed=6)
    resumed = _sampler(src, tgt)
    resumed.load_state_dict(state)
    assert list(resumed) == expected[6:]


def test_sharded_ranks_are_disjoint_equal_and_complete_up_to_the_remainder() -> None:
    src, tgt = _skewed_lengths(2500)
    world_size = 3
    global_batches = _epoch(_sampler(src, tgt), 6)
    shards = [
        _epoch(_sampler(src, tgt, rank=rank, world_size=world_size), 6)
        for rank in range(world_size)
    ]
    assert len({len(shard) for shard in shards}) == 1
    assert len(shards[0]) == len(global_batches) // world_size
    # The batch count may differ a little between epochs; len() is the current epoch's.
    sized = _sampler(src, tgt, rank=1, world_size=world_size)
    sized.set_epoch(6)
    assert len(sized) == len(shards[1])
    covered = [index for shard in shards for batch in shard for index in batch]
    assert len(covered) == len(set(covered))
    kept = len(shards[0]) * world_size
    assert set(covered) == {index for batch in global_batches[:kept] for index in batch}
    dropped = {index for batch in global_batches[kept:] for index in batch}
    assert set(covered) | dropped == set(range(2500))


def test_resume_state_is_per_world_size() -> None:
    src, tgt = _skewed_lengths(500)
    state = _sampler(src, tgt, rank=0, world_size=2).state_dict()
    with pytest.raises(ValueError, match="world_size"):
        _sampler(src, tgt).load_state_dict(state)


def test_inference_mode_is_sorted_by_length_and_complete_across_ranks() -> None:
    src, tgt = _skewed_lengths(1000)
    batches = _epoch(_sampler(src, tgt, shuffle=False), 0)
    longest = [max(max(src[i], tgt[i]) for i in batch) for batch in batches]
    assert longest == sorted(longest)
    assert _epoch(_sampler(src, tgt, shuffle=False), 1) == batches
    shards = [_epoch(_sampler(src, tgt, shuffle=False, rank=r, world_size=3), 0) for r in range(3)]
    assert sorted(i for shard in shards for batch in shard for i in batch) == list(range(1000))


def test_bucketing_keeps_padding_far_below_random_batching() -> None:
    src, tgt = _skewed_lengths(5000, seed=1)
    bucketed = _epoch(_sampler(src, tgt, max_tokens=2000, bucket_size=50), 0)
    # Random batching: shuffled order cut greedily under the same token budget.
    order = np.random.default_rng(1).permutation(len(src))
    random_batches, current, longest = [], [], 0
    for index in order.tolist():
        size = max(src[index], tgt[index]) + 1
        if current and (len(current) + 1) * max(longest, size) > 2000:
            random_batches.append(current)
            current, longest = [], 0
        current.append(index)
        longest = max(longest, size)
    random_batches.append(current)
    bucketed_padding = _padding_fraction(bucketed, src, tgt)
    random_padding = _padding_fraction(random_batches, src, tgt)
    print(f"padding fraction: bucketed {bucketed_padding:.3f}, random {random_padding:.3f}")
    assert bucketed_padding < 0.5 * random_padding


def test_collate_layout() -> None:
    samples = [
        (np.array([10, 11, 12], dtype=np.uint16), np.array([20], dtype=np.uint16)),
        (np.array([13], dtype=np.uint16), np.array([21, 22, 23, 24], dtype=np.uint16)),
        (np.array([], dtype=np.uint16), np.array([], dtype=np.uint16)),
    ]
    batch = collate(samples, [7, 3, 9])
    pad, eos, bos = PAD_ID, EOS_ID, BOS_ID
    assert batch.src.tolist() == [[10, 11, 12, eos], [13, eos, pad, pad], [eos, pad, pad, pad]]
    assert batch.src_lengths.tolist() == [4, 2, 1]
    assert batch.tgt_in.tolist() == [
        [bos, 20, pad, pad, pad],
        [bos, 21, 22, 23, 24],
        [bos, pad, pad, pad, pad],
    ]
    assert batch.tgt_out.tolist() == [
        [20, eos, pad, pad, pad],
        [21, 22, 23, 24, eos],
        [eos, pad, pad, pad, pad],
    ]
    assert batch.indices.tolist() == [7, 3, 9]
    assert batch.num_tgt_tokens == 2 + 5 + 1 == int((batch.tgt_out != pad).sum())
    for tensor in (batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out, batch.indices):
        assert tensor.dtype == torch.int64


def test_batch_to_keeps_lengths_on_cpu() -> None:
    batch = collate([(np.array([5, 6]), np.array([7]))], [0])
    moved = batch.to("meta")
    assert moved.src.device.type == "meta" and moved.tgt_out.device.type == "meta"
    assert moved.src_lengths.device.type == "cpu"
    assert moved.num_tgt_tokens == batch.num_tgt_tokens


def _write_dataset(directory: Path, pairs: list[tuple[list[int], list[int]]]) -> ParallelDataset:
    for side in (0, 1):
        writer = TokenArrayWriter(
            prefix=directory / f"split.{'src' if side == 0 else 'tgt'}", dtype=np.uint16
        )
        # Two chunks, as the encoder streams them.
        for chunk in (pairs[:5], pairs[5:]):
            sequences = [pair[side] for pair in chunk]
            writer.append(
                np.array([t for ids in sequences for t in ids], dtype=np.uint16),
                np.array([len(ids) for ids in sequences]),
            )
        writer.close()
    return ParallelDataset.load(directory / "split")


def test_memory_mapped_dataset_and_loader(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    pairs = [
        (
            rng.integers(4, 50, size=rng.integers(0, 9)).tolist(),
            rng.integers(4, 50, size=rng.integers(1, 9)).tolist(),
        )
        for _ in range(40)
    ]
    dataset = _write_dataset(tmp_path, pairs)
    assert len(dataset) == 40
    assert dataset.src_lengths.tolist() == [len(src) for src, _ in pairs]
    assert [dataset[i][1].tolist() for i in range(40)] == [tgt for _, tgt in pairs]
    assert dataset[-1][0].tolist() == pairs[-1][0]
    assert [dataset[i][0].tolist() for i in range(40)] == [src for src, _ in pairs]  # empty too
    # Read from the file, not through its map: random reads through a map make the kernel
    # map neighbouring pages too, and a big corpus then becomes resident.
    assert not np.shares_memory(dataset[0][1], dataset.tgt._tokens)
    assert dataset.src_lengths.dtype == np.int32  # 4 bytes a sentence, not 8
    with pytest.raises(IndexError):
        dataset[40]
    # Pickled (as for DataLoader workers) by file name, not by content.
    copy = pickle.loads(pickle.dumps(dataset))
    assert len(pickle.dumps(dataset)) < 2000
    assert copy[3][0].tolist() == pairs[3][0]

    sampler = TokenBucketSampler(
        src_lengths=dataset.src_lengths, tgt_lengths=dataset.tgt_lengths, max_tokens=30, seed=1
    )
    # As the trainer builds it: the dataset's __getitems__ hands the indices on to collate.
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate)
    seen = []
    for batch in loader:
        assert isinstance(batch, Batch)
        for row, index in enumerate(batch.indices.tolist()):
            length = len(pairs[index][1])
            assert batch.tgt_out[row, :length].tolist() == pairs[index][1]
            seen.append(index)
    assert sorted(seen) == list(range(40))
