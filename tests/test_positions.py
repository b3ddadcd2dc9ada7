"""Accuracy by target position under teacher forcing (seq2seq.study.positions)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_luong_model, random_transformer_model
from torch import nn

from seq2seq.study.positions import (
    THIRDS,
    markdown_section,
    pooled_accuracy,
    position_counts,
    position_scores,
)


class IdSide:
    """A tokenizer side whose text is the ids themselves: "5 5 6" -> [5, 5, 6]."""

    def encode(self, lines):
        return [[int(piece) for piece in line.split()] for line in lines]


class IdTokenizers:
    src = tgt = IdSide()


class PreviousTokenModel(nn.Module):
    """Predicts, at every position, the token it was given there: the previous reference piece
    (BOS at the start)."""

    vocab = 12

    def forward(self, src, src_lengths, tgt_in, *, need_weights=True):
        return nn.functional.one_hot(tgt_in, self.vocab).float(), None  # (B, T, V)

    def project(self, features):
        return features


def test_counts_split_each_reference_into_thirds():
    sources = ["4 5", "6", "4 4 4 4"]
    references = ["5 5 5 6 6", "7", "8 8 8 8 8 8 8 8"]
    counts = position_counts(PreviousTokenModel(), IdTokenizers(), sources, references,
                             batch_size=2)
    # "5 5 5 6 6" + EOS: positions 0..5 in thirds 0 0 1 1 2 2; right where a piece repeats
    # the one before it (positions 1, 2 and 4), never at EOS.
    np.testing.assert_array_equal(counts[0], [[1, 2], [1, 2], [1, 2]])
    # "7" + EOS: 2 positions, thirds 0 and 1; the last third is empty.
    np.testing.assert_array_equal(counts[1], [[0, 1], [0, 1], [0, 0]])
    # 8 eights + EOS = 9 positions, 3 a third: all right but the first and EOS.
    np.testing.assert_array_equal(counts[2], [[2, 3], [3, 3], [2, 3]])


@pytest.mark.parametrize("make_model", [random_luong_model, random_transformer_model])
def test_batched_counts_equal_one_sentence_at_a_time(make_model):
    model = make_model(vocab=20)
    generator = np.random.default_rng(4)

    def line(low, high):
        return " ".join(str(i) for i in generator.integers(4, 20, generator.integers(low, high)))

    sources = [line(1, 9) for _ in range(9)]
    references = [line(0, 12) for _ in range(9)]
    batched = position_counts(model, IdTokenizers(), sources, references, batch_size=4)
    alone = np.concatenate([position_counts(model, IdTokenizers(), [s], [r])
                            for s, r in zip(sources, references, strict=True)])
    np.testing.assert_array_equal(batched, alone)
    lengths = [len(r.split()) + 1 for r in references]  # EOS counted
    np.testing.assert_array_equal(batched[..., 1].sum(axis=1), lengths)
    assert not model.training  # left as it was found


def test_pooled_accuracy_and_its_interval():
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 6, size=(200, 3))
    correct = rng.binomial(tokens, [0.9, 0.6, 0.3])
    run = np.stack([correct, tokens], axis=-1)  # (N, 3, 2)
    pooled = pooled_accuracy([run, run])
    for k, name in enumerate(THIRDS):
        assert pooled[name]["accuracy"] == pytest.approx(100 * correct[:, k].sum()
                                                         / tokens[:, k].sum())
        assert pooled[name]["pieces"] == tokens[:, k].sum()
        assert 1 < pooled[name]["ci"] < 10  # a few points over 200 sentences
    assert pooled["first"]["accuracy"] > pooled["middle"]["accuracy"] > pooled["last"]["accuracy"]
    # A sentence-level bootstrap: more sentences, a narrower interval.
    assert pooled_accuracy([np.tile(run, (4, 1, 1))])["middle"]["ci"] < pooled["middle"]["ci"]


def test_report_section():
    run = np.array([[[1, 2], [2, 2], [0, 1]]])
    rows = position_scores([("dot", [run]), ("none", [])])
    assert [row["group"] for row in rows] == ["dot"]
    lines = markdown_section(rows)
    assert lines[0] == "## By target position"
    assert "| dot | 50.00 ± 0.00 | 100.00 ± 0.00 | 0.00 ± 0.00 |" in lines
    assert markdown_section([]) == []
