"""The faithfulness probe: decoding with each step's attention replaced (uniform or shifted)."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import (
    beam_search,
    padded_random_sources,
    random_luong_model,
    random_transformer_model,
)

from seq2seq.models.attention import Scorer
from seq2seq.study.faithfulness import (
    PROBES,
    probed_model,
    shifted_weights,
    uniform_weights,
)

SEARCH = {"beam_size": 3, "max_len_a": 1.0, "max_len_b": 4, "nbest": 3, "return_attention": True}


class ConstantScorer(Scorer):
    """Energy 0 for every source position: softmax and sparsemax both give uniform weights."""

    def __init__(self, *, query_dim: int, key_dim: int) -> None:
        super().__init__()

    def score(self, query, keys):
        return query.new_zeros(query.size(0), query.size(1), keys.size(1))  # (B, T, S)


def assert_same_search(first, second) -> None:
    for a_list, b_list in zip(first, second, strict=True):
        assert [h.tokens for h in a_list] == [h.tokens for h in b_list]
        for a, b in zip(a_list, b_list, strict=True):
            assert a.score == pytest.approx(b.score, abs=1e-5)
            torch.testing.assert_close(a.attention, b.attention)


def test_uniform_weights_spread_over_real_positions():
    real = torch.tensor([[True, True, True, False], [True, False, False, False]])
    torch.testing.assert_close(uniform_weights(real),
                               torch.tensor([[1 / 3, 1 / 3, 1 / 3, 0.0], [1.0, 0, 0, 0]]))


def test_shifted_weights_move_half_the_real_length_cyclically():
    weights = torch.tensor([[0.7, 0.2, 0.1, 0.0],
                            [0.4, 0.3, 0.2, 0.1],
                            [1.0, 0.0, 0.0, 0.0]])
    real = torch.tensor([[True, True, True, False],
                         [True, True, True, True],
                         [True, False, False, False]])
    expected = torch.tensor([[0.1, 0.7, 0.2, 0.0],   # 3 pieces: shifted by 1
                             [0.2, 0.1, 0.4, 0.3],   # 4 pieces: shifted by 2
                             [1.0, 0.0, 0.0, 0.0]])  # 1 piece: nowhere else to go
    torch.testing.assert_close(shifted_weights(weights, real), expected)
    # Leading dims (heads, steps) broadcast.
    stacked = weights[:, None, None].expand(3, 2, 5, 4)
    torch.testing.assert_close(shifted_weights(stacked, real[:, None, None].expand(3, 2, 5, 4)),
                               expected[:, None, None].expand(3, 2, 5, 4))


@pytest.mark.parametrize(("attention", "options"), [
    ("additive", {}),
    ("multihead", {}),
    ("scaled_dot", {"normalizer": "sparsemax"}),
])
@pytest.mark.parametrize("input_feeding", [True, False])
def test_uniform_probe_equals_a_model_whose_scorer_returns_constants(attention, options,
                                                                     input_feeding):
    model = random_luong_model(attention=attention, attention_options=options,
                               input_feeding=input_feeding)
    constant = copy.deepcopy(model)
    constant.decoder.attention.scorer = ConstantScorer(query_dim=16, key_dim=16)
    src, src_lengths = padded_random_sources(6, vocab=20)
    with torch.no_grad():
        probed = beam_search(probed_model(model, "uniform"), src, src_lengths, **SEARCH)
        expected = beam_search(constant, src, src_lengths, **SEARCH)
    assert_same_search(probed, expected)
    for hypotheses, length in zip(probed, src_lengths.tolist(), strict=True):
        torch.testing.assert_close(hypotheses[0].attention,
                                   torch.full_like(hypotheses[0].attention, 1 / length))


def test_uniform_probe_on_a_transformer_equals_constant_cross_attention_energies():
    model = random_transformer_model(num_layers=2)
    constant = copy.deepcopy(model)
    with torch.no_grad():
        for layer in constant.decoder.layers:  # query 0: every energy q.k is 0
            layer.cross_attention.query_proj.weight.zero_()
            layer.cross_attention.query_proj.bias.zero_()
    src, src_lengths = padded_random_sources(6, vocab=20)
    with torch.no_grad():
        probed = beam_search(probed_model(model, "uniform"), src, src_lengths, **SEARCH)
        expected = beam_search(constant, src, src_lengths, **SEARCH)
    assert_same_search(probed, expected)


def test_shifted_probe_moves_the_models_own_weights():
    # Without input feeding nothing upstream of the attention depends on earlier weights, so
    # every teacher-forced step's probed weights are the model's, shifted.
    model = random_luong_model(attention="additive", input_feeding=False)
    src, src_lengths = padded_random_sources(5, vocab=20)
    tgt_in = torch.randint(4, 20, (5, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        _, weights = model(src, src_lengths, tgt_in)
        _, probed = probed_model(model, "shifted")(src, src_lengths, tgt_in)
    real = (src != 0)[:, None, :].expand_as(weights)
    torch.testing.assert_close(probed, shifted_weights(weights, real))
    assert not torch.allclose(probed, weights)


@pytest.mark.parametrize("probe", PROBES)
def test_probing_leaves_the_model_untouched(probe):
    model = random_transformer_model()
    src, src_lengths = padded_random_sources(4, vocab=20)
    with torch.no_grad():
        before = beam_search(model, src, src_lengths, **SEARCH)
        rng = torch.random.get_rng_state()
        probed = probed_model(model, probe)
        assert torch.equal(torch.random.get_rng_state(), rng)  # no random init drawn
        beam_search(probed, src, src_lengths, **SEARCH)
        after = beam_search(model, src, src_lengths, **SEARCH)
    assert_same_search(before, after)
    assert probed is not model


def test_probe_errors():
    model = random_luong_model()
    with pytest.raises(ValueError, match="probe must be one of uniform, shifted"):
        probed_model(model, "random")
    model.decoder.attention = None
    with pytest.raises(ValueError, match="no attention to probe"):
        probed_model(model, "uniform")
