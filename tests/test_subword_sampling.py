"""Subword regularization (trainer.subword_sampling): an epoch's draw seeded by its number, the
same text, no <unk> written, batches cut from the draw's lengths, the same pieces in a worker and
after a resume."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
import torch

from seq2seq.checkpoint import load_checkpoint
from seq2seq.config_types import ConfigError
from seq2seq.data.batching import TokenBucketSampler
from seq2seq.data.dataset import ParallelDataset, TokenArray
from seq2seq.data.subword_sampling import SampledPairs, sampled_training_pairs
from seq2seq.data.tokenizer import SentencePieceTokenizer, SubsetTokenizer, Tokenizers
from seq2seq.data.vocab import UNK_ID
from seq2seq.training.run import train
from seq2seq.training.settings import TrainerSettings


def token_array(encoded: list[list[int]]) -> TokenArray:
    lengths = np.array([len(ids) for ids in encoded], dtype=np.int64)
    return TokenArray(tokens=np.array([i for ids in encoded for i in ids], dtype=np.uint16),
                      offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def corpus(request):
    """Tokenizers (a joint model, the target side a subset of it) and the pairs they stored."""
    from conftest import make_pairs

    pairs = make_pairs(random.Random(3), 200, min_words=4, max_words=10)
    base = SentencePieceTokenizer.train([s for pair in pairs for s in pair],
                                        model_type=request.param, vocab_size=80, seed=1)
    targets = base.encode([tgt for _, tgt in pairs])
    tokenizers = Tokenizers(src=base, joint=True, tgt=SubsetTokenizer(
        base=base, kept_ids=sorted({i for ids in targets for i in ids})))
    stored = ParallelDataset(src=token_array(base.encode([src for src, _ in pairs])),
                             tgt=token_array(tokenizers.tgt.encode([t for _, t in pairs])))
    return tokenizers, stored


def test_an_epoch_is_drawn_anew_from_its_seed_and_number(corpus):
    tokenizers, stored = corpus
    sampled = SampledPairs(stored, tokenizers, alpha=0.3, seed=1)
    every = list(range(len(stored)))
    first = sampled.__getitems__(every)
    again = SampledPairs(stored, tokenizers, alpha=0.3, seed=1).__getitems__(every)
    assert all(np.array_equal(a[side], b[side]) for a, b in zip(first, again, strict=True)
               for side in (0, 1))
    assert first.indices == every
    other_seed = SampledPairs(stored, tokenizers, alpha=0.3, seed=2).__getitems__(every)
    sampled.set_epoch(1)
    next_epoch = sampled.__getitems__(every)
    for draw in (other_seed, next_epoch):
        assert any(not np.array_equal(a[0], b[0]) for a, b in zip(first, draw, strict=True))
    sampled.set_epoch(0)  # an epoch drawn again (a resumed run) is drawn the same
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(first, sampled.__getitems__(every),
                                                           strict=True))
    # Some pairs are cut otherwise than stored, and every draw reads the stored text.
    assert any(not np.array_equal(pair[0], stored[i][0]) for i, pair in zip(every, first,
                                                                             strict=True))
    for side, tokenizer in enumerate((tokenizers.src, tokenizers.tgt)):
        assert (tokenizer.decode([pair[side] for pair in first])
                == tokenizer.decode([stored[i][side] for i in every]))


def test_a_target_drawn_with_a_piece_outside_the_output_layer_keeps_its_stored_pieces(corpus):
    tokenizers, stored = corpus
    sampled = SampledPairs(stored, tokenizers, alpha=1.0, seed=1)
    drawn = sampled.__getitems__(list(range(len(stored))))
    assert not any((pair[1] == UNK_ID).any() for pair in drawn)
    # The source side has no subset: it may hold any piece of the model, and no <unk>.
    assert not any((pair[0] == UNK_ID).any() for pair in drawn)


def test_a_draw_longer_than_the_length_filter_keeps_its_stored_pieces(corpus):
    """data.filter.max_length holds for the draws too: a longer draw keeps the stored pieces
    (which the data stage filtered), a shorter one is kept."""
    tokenizers, stored = corpus
    every = list(range(len(stored)))
    unlimited = SampledPairs(stored, tokenizers, alpha=1.0, seed=1).__getitems__(every)
    limit = int(np.median([len(pair[0]) for pair in unlimited]))  # half the draws are longer
    limited = SampledPairs(stored, tokenizers, alpha=1.0, seed=1,
                           max_length=limit).__getitems__(every)
    for index, (pair, free) in enumerate(zip(limited, unlimited, strict=True)):
        for side in (0, 1):
            want = stored[index][side] if len(free[side]) > limit else free[side]
            assert np.array_equal(pair[side], want)
    assert sum(len(free[0]) > limit for free in unlimited) > 10


def test_batching_reads_the_lengths_of_the_draw(corpus):
    tokenizers, stored = corpus
    sampled = SampledPairs(stored, tokenizers, alpha=0.3, seed=1)
    sampled.set_epoch(3)
    drawn = sampled.__getitems__(list(range(len(stored))))
    assert [len(pair[0]) for pair in drawn] == sampled.src_lengths.tolist()
    assert [len(pair[1]) for pair in drawn] == sampled.tgt_lengths.tolist()
    assert sampled.src_lengths.sum() > stored.src_lengths.sum()  # more pieces than the best
    assert not sampled.same_each_epoch and stored.same_each_epoch
    sampler = TokenBucketSampler(src_lengths=stored.src_lengths, tgt_lengths=stored.tgt_lengths,
                                 max_tokens=60, seed=1)
    sampler.set_lengths(sampled.src_lengths, sampled.tgt_lengths)
    sampler.set_epoch(3)
    for batch in sampler:
        longest = max(max(len(drawn[i][0]), len(drawn[i][1])) + 1 for i in batch)
        assert len(batch) == 1 or len(batch) * longest <= 60
    with pytest.raises(ValueError, match="lengths for"):
        sampler.set_lengths(sampled.src_lengths[:-1], sampled.tgt_lengths[:-1])


def test_a_worker_process_reads_the_same_pieces(corpus):
    tokenizers, stored = corpus
    sampled = SampledPairs(stored, tokenizers, alpha=0.3, seed=1)
    sampled.set_epoch(2)
    copy = pickle.loads(pickle.dumps(sampled))
    batch = [5, 3, 17, 11]
    for a, b in zip(sampled.__getitems__(batch), copy.__getitems__(batch), strict=True):
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_alpha_zero_keeps_the_stored_pairs_and_the_option_is_checked(corpus):
    tokenizers, stored = corpus
    assert sampled_training_pairs(stored, tokenizers, alpha=0.0, seed=1) is stored
    for bad in (-0.1, 1.5):
        with pytest.raises(ConfigError, match="trainer.subword_sampling must be in"):
            TrainerSettings.from_dict({"subword_sampling": bad})


def test_resumed_run_with_sampling_equals_uninterrupted_one_in_a_worker(tiny_train_config,
                                                                        tmp_path):
    """Stopped mid-epoch after 12 steps and resumed (pairs drawn in this process) = 24 steps
    straight (read by a DataLoader worker), over an epoch's end (19 batches an epoch); and the
    draws changed what was learned."""
    common = {"trainer.subword_sampling": 0.2, "trainer.valid_every": 12,
              "trainer.save_every": 12, "trainer.valid.max_sentences": 4, "model.dropout": 0.0}
    split = tmp_path / "split"
    train(tiny_train_config(**common, **{"trainer.max_steps": 12}), split)
    train(tiny_train_config(**common, **{"trainer.max_steps": 24, "trainer.resume": "auto"}),
          split)
    train(tiny_train_config(**common, **{"trainer.max_steps": 24, "batch.num_workers": 1}),
          tmp_path / "straight")
    train(tiny_train_config(**{**common, "trainer.subword_sampling": 0.0,
                               "trainer.max_steps": 24}), tmp_path / "stored")
    states = [load_checkpoint(path / "checkpoints" / "last.pt")
              for path in (split, tmp_path / "straight", tmp_path / "stored")]
    assert states[1]["trainer_state"]["epoch"] >= 1  # the run crossed into a second epoch
    models = [state["model"] for state in states]
    for name, tensor in models[1].items():
        assert torch.equal(models[0][name], tensor), f"{name} differs after resume"
    assert any(not torch.equal(models[2][name], tensor) for name, tensor in models[1].items())


def test_train_pairs_keeps_the_first_pairs(corpus, tiny_train_config, tmp_path, caplog):
    """trainer.train_pairs=N (the proxies' option): the first N stored pairs, as stored."""
    _, stored = corpus
    first = stored.first(7)
    assert len(first) == 7
    for index in range(7):
        assert np.array_equal(first[index][0], stored[index][0])
        assert np.array_equal(first[index][1], stored[index][1])
    assert len(stored.first(10**6)) == len(stored)
    with caplog.at_level("INFO"):
        train(tiny_train_config(**{"trainer.train_pairs": 3, "trainer.max_steps": 2,
                                   "trainer.valid.max_sentences": 2}), tmp_path / "three")
    assert "training: 1 batches per epoch" in caplog.text
