"""Sampling (seq2seq/inference/sampling.py): each filter, reproducibility, top_k=1 = greedy."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import greedy_search
from test_search_loop import random_sources, tiny_model

from seq2seq.inference.decode_options import DecodeOptions
from seq2seq.inference.forcing import pad_prefixes
from seq2seq.inference.sampling import probabilities, sample_search

OPTIONS = {"max_len_a": 1.0, "max_len_b": 3}


def sample(**options) -> DecodeOptions:
    return DecodeOptions(search="sample", **options)


def log_probs_of(probs: list[float]) -> torch.Tensor:
    return torch.tensor([probs]).log()


def test_each_filter_keeps_what_it_names():
    log_probs = log_probs_of([0.0, 0.5, 0.25, 0.15, 0.1])
    assert probabilities(log_probs, sample()).gt(0).tolist() == [[False, True, True, True, True]]
    assert probabilities(log_probs, sample(top_k=2)).gt(0).tolist() == \
        [[False, True, True, False, False]]
    # 0.5 + 0.25 reaches 0.7: the third piece is not needed.
    assert probabilities(log_probs, sample(top_p=0.7)).gt(0).tolist() == \
        [[False, True, True, False, False]]
    assert probabilities(log_probs, sample(top_p=0.76)).gt(0).tolist() == \
        [[False, True, True, True, False]]
    assert probabilities(log_probs, sample(epsilon=0.2)).gt(0).tolist() == \
        [[False, True, True, False, False]]
    # The most probable piece survives any epsilon.
    assert probabilities(log_probs, sample(epsilon=0.9)).gt(0).tolist() == \
        [[False, True, False, False, False]]
    cold = probabilities(log_probs, sample(temperature=0.5))[0]
    assert math.isclose(float(cold[1] / cold[2]), 4.0, rel_tol=1e-5)  # (0.5 / 0.25) ** 2


@pytest.mark.parametrize("options", [{"temperature": 0}, {"top_k": -1}, {"top_p": 0},
                                     {"top_p": 1.5}, {"epsilon": 1}])
def test_options_out_of_range_are_one_line_errors(options):
    with pytest.raises(ValueError, match=next(iter(options))) as raised:
        sample(**options)
    assert "\n" not in str(raised.value)


def test_top_k_1_is_greedy_search_with_its_scores():
    model = tiny_model("gru", "bahdanau", "additive", table_seed=2)
    src, src_lengths = random_sources(6, seed=4)
    greedy = greedy_search(model, src, src_lengths, **OPTIONS)
    sampled = sample_search(model, src, src_lengths, sample(top_k=1, temperature=3, nbest=2),
                            **OPTIONS)
    for best, samples in zip(greedy, sampled, strict=True):
        assert [h.tokens for h in samples] == [best[0].tokens] * 2
        assert all(math.isclose(h.score, best[0].score, rel_tol=1e-5) for h in samples)


def test_a_seed_reproduces_the_samples_and_nbest_draws_independently():
    model = tiny_model("gru", "luong", "dot", table_seed=5)
    src, src_lengths = random_sources(5, seed=6)

    def draw(seed: int):
        generator = torch.Generator().manual_seed(seed)
        return sample_search(model, src, src_lengths, sample(temperature=2.0, nbest=4),
                             generator=generator, **OPTIONS)

    first, again, other = draw(1), draw(1), draw(2)
    tokens = [[h.tokens for h in n_best] for n_best in first]
    assert tokens == [[h.tokens for h in n_best] for n_best in again]
    assert tokens != [[h.tokens for h in n_best] for n_best in other]
    assert any(len({tuple(t) for t in n_best}) > 1 for n_best in tokens)  # not one sample 4x
    for n_best in first:
        scores = [h.score for h in n_best]
        assert scores == sorted(scores, reverse=True) and len(n_best) == 4


def test_samples_keep_their_prefix():
    model = tiny_model("gru", "bahdanau", "additive", table_seed=2)
    src, src_lengths = random_sources(3, seed=8)
    prefixes = pad_prefixes([[5, 9], [], [11]], "cpu")
    results = sample_search(model, src, src_lengths, sample(nbest=3),
                            generator=torch.Generator().manual_seed(0), prefixes=prefixes,
                            **OPTIONS)
    for prefix, n_best in zip([[5, 9], [], [11]], results, strict=True):
        assert all(h.tokens[: len(prefix)] == prefix for h in n_best)
