"""Lexically constrained beam search (seq2seq/inference/constraints.py): every phrase in every
output, at every beam size, in a batch as alone, beside prefixes and for ensembles."""

from __future__ import annotations

import pytest
import torch
from conftest import beam_search
from test_search_loop import random_sources, tiny_model

from seq2seq.data.vocab import EOS_ID
from seq2seq.inference.constraints import Grid, pad_phrases
from seq2seq.inference.ensemble import Ensemble
from seq2seq.inference.forcing import pad_prefixes
from seq2seq.inference.search_loop import run_search


def grid_search(model, src, src_lengths, *, constraints, beam_size, nbest=1, **options):
    """``run_search`` with the grid: what ``search=beam`` runs for a batch with constraints."""
    return run_search(model, src, src_lengths, Grid(constraints, beam_size, src.device),
                      nbest=nbest, **options)


OPTIONS = {"max_len_a": 1.0, "max_len_b": 2}
CONSTRAINTS = [[[5, 6]], [], [[9], [7, 8, 10]], [[12, 12], [4]]]


def contains(tokens: list[int], phrase: list[int]) -> bool:
    return any(tokens[i: i + len(phrase)] == phrase for i in range(len(tokens)))


@pytest.mark.parametrize("beam_size", [1, 2, 4])
@pytest.mark.parametrize("family", [("gru", "bahdanau", "additive"), ("transformer", "transformer",
                                                                       "-")])
def test_every_output_holds_every_phrase_and_a_batch_decodes_as_alone(beam_size, family):
    model = tiny_model(*family, table_seed=4)
    src, src_lengths = random_sources(4, seed=9)
    nbest = min(2, beam_size)
    results = grid_search(model, src, src_lengths, constraints=CONSTRAINTS,
                          beam_size=beam_size, nbest=nbest, **OPTIONS)
    for phrases, n_best in zip(CONSTRAINTS, results, strict=True):
        assert n_best and all(contains(h.tokens, phrase) for h in n_best for phrase in phrases)
        assert [h.score for h in n_best] == sorted((h.score for h in n_best), reverse=True)
    for row in range(4):
        alone = grid_search(model, src[row: row + 1], src_lengths[row: row + 1],
                            constraints=CONSTRAINTS[row: row + 1],
                            beam_size=beam_size, nbest=nbest, **OPTIONS)
        assert [h.tokens for h in alone[0]] == [h.tokens for h in results[row]]


def test_no_constraints_is_beam_search():
    model = tiny_model("gru", "luong", "dot", table_seed=6)
    src, src_lengths = random_sources(5, seed=2)
    plain = beam_search(model, src, src_lengths, beam_size=3, nbest=2, return_attention=True,
                        **OPTIONS)
    free = grid_search(model, src, src_lengths, constraints=[[]] * 5, beam_size=3,
                       nbest=2, return_attention=True, **OPTIONS)
    for a, b in zip(plain, free, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        torch.testing.assert_close([h.score for h in a], [h.score for h in b])
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x.attention, y.attention)


def test_constraints_beside_a_prefix_and_for_an_ensemble():
    first = tiny_model("gru", "bahdanau", "additive", table_seed=1)
    second = tiny_model("gru", "luong", "general", table_seed=2)
    src, src_lengths = random_sources(4, seed=5)
    prefixes = pad_prefixes([[11], [], [4, 4], []], "cpu")
    results = grid_search(Ensemble([first, second]), src, src_lengths,
                          constraints=CONSTRAINTS, beam_size=2, prefixes=prefixes,
                          return_attention=True, **OPTIONS)
    for phrases, prefix, n_best in zip(CONSTRAINTS, [[11], [], [4, 4], []], results,
                                       strict=True):
        (best,) = n_best
        assert best.tokens[: len(prefix)] == prefix
        assert all(contains(best.tokens, phrase) for phrase in phrases)
        assert best.attention.shape[0] == len(best.tokens) + 1


def test_bad_phrases_are_one_line_errors():
    with pytest.raises(ValueError, match="constraint 2 is empty"):
        pad_phrases([[[4], []]], "cpu")
    with pytest.raises(ValueError, match="at most"):
        pad_phrases([[[4]] * 63], "cpu")
    with pytest.raises(ValueError, match="sentence 2: constraint 1 holds a special piece"):
        pad_phrases([[[4]], [[5, EOS_ID]]], "cpu")
