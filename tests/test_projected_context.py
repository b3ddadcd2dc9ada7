"""Combine's context half projected onto the memory for beam search
(seq2seq/inference/projected_context.py, wired in by seq2seq/inference/folding.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same_hypotheses, padded_random_sources, random_luong_model
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from seq2seq.inference import folding
from seq2seq.inference.ensemble import Ensemble
from seq2seq.inference.folding import fold_embeddings, without_projected_context
from seq2seq.inference.projected_context import (
    ProjectedContextAttention,
    StateCombine,
    can_project_context,
)
from seq2seq.inference.quantize import quantize_for_cpu
from seq2seq.inference.search import beam_search, greedy_search
from seq2seq.inference.shortlist import restrict
from seq2seq.inference.translator import Translator
from seq2seq.models.attention import Scorer

SINGLE_HEAD = ["additive", "dot", "general", "scaled_dot", "gaussian", "location"]
# Encoder output (Dv) 8, decoder state (H) 16, attentional vector (D) 12: a mix-up of the
# three sizes in the split of combine's columns cannot pass.
UNEQUAL_SIZES = {"bidirectional": False, "output_dim": 12}


def sources():
    return padded_random_sources(9, vocab=20, max_len=8, seed=3)


@pytest.fixture(autouse=True)
def fold_every_batch(monkeypatch):
    monkeypatch.setattr(folding, "MIN_FOLDED_BATCH", 1)


CASES = {
    **{f"{name}-{feeding}": {"attention": name, "input_feeding": feeding == "feeding"}
       for name in SINGLE_HEAD for feeding in ("feeding", "no-feeding")},
    **{f"{name}-unequal-sizes": {"attention": name, **UNEQUAL_SIZES}
       for name in ("additive", "general", "gaussian", "location")},
    "dot-projected-keys-unequal-sizes": {
        "attention": "dot", "attention_options": {"project_keys": True}, **UNEQUAL_SIZES},
    "lstm": {"rnn_type": "lstm"},
}


@pytest.mark.parametrize("case", CASES)
def test_projected_context_computes_what_the_model_computes(case):
    model = random_luong_model(**CASES[case])
    folded = fold_embeddings(model)
    assert isinstance(folded.decoder.attention, ProjectedContextAttention)
    assert isinstance(folded.decoder.combine, StateCombine)
    src, src_lengths = sources()
    tgt_in = torch.randint(4, 20, (src.size(0), 6), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want_features, want_weights = model(src, src_lengths, tgt_in)
        have_features, have_weights = folded(src, src_lengths, tgt_in)
    torch.testing.assert_close(have_features, want_features)
    torch.testing.assert_close(have_weights, want_weights)
    # Beam search reorders and prunes the encoded source: the projection goes with the keys.
    options = {"max_len_a": 1.0, "max_len_b": 3, "return_attention": True}
    expected = beam_search(model, src, src_lengths, beam_size=4, nbest=2, **options)
    got = beam_search(folded, src, src_lengths, beam_size=4, nbest=2, **options)
    assert len({len(n_best[0].tokens) for n_best in expected}) > 1  # mixed lengths
    assert_same_hypotheses(got, expected)


def test_the_encoded_source_holds_the_keys_then_the_projected_memory():
    model = random_luong_model(**UNEQUAL_SIZES)
    folded = fold_embeddings(model)
    src, src_lengths = sources()
    with torch.no_grad():
        want = model.encode(src, src_lengths)
        have = folded.encode(src, src_lengths)
    scorer_width, memory_width = want.keys.size(-1), want.memory.size(-1)  # 16, 8
    assert have.keys.shape == (*want.keys.shape[:2], scorer_width + 12)
    torch.testing.assert_close(have.keys[..., :scorer_width], want.keys)
    context_half = model.decoder.combine.weight[:, :memory_width]  # (D, Dv)
    torch.testing.assert_close(have.keys[..., scorer_width:], want.memory @ context_half.T)


def test_a_beam_step_skips_the_context_product():
    model = random_luong_model()
    folded = fold_embeddings(model)
    unprojected = without_projected_context(folded)
    src, src_lengths = sources()
    rows = 4 * src.size(0)  # four beams per sentence

    @torch.no_grad()
    def step_flops(m):
        encoded = m.encode(src, src_lengths)
        state = m.init_state(encoded.index_select(torch.arange(src.size(0)).repeat_interleave(4)))
        m.decode_step(torch.full((rows,), 5), state, encoded)  # fills the table's row 5
        with FlopCounterMode(display=False) as counter:
            m.decode_step(torch.full((rows,), 5), state, encoded)
        return counter.get_total_flops()

    context, output = 16, 16
    assert step_flops(unprojected) - step_flops(folded) == 2 * rows * context * output


def test_multi_head_scorers_keep_their_context():
    model = random_luong_model(attention="multihead")
    assert not can_project_context(model.decoder)
    folded = fold_embeddings(model)
    assert folded.decoder.attention is model.decoder.attention
    assert folded.decoder.combine is model.decoder.combine


class PositionBiasScorer(Scorer):
    """A user-defined scorer whose precomputed keys are (B, S), not (B, S, *)."""

    def __init__(self, *, query_dim: int, key_dim: int):
        super().__init__()
        self.query_proj = nn.Linear(query_dim, key_dim, bias=False)
        self.key_bias = nn.Linear(key_dim, 1)

    def precompute_keys(self, keys):
        return torch.cat([keys, self.key_bias(keys)], dim=-1).transpose(1, 2)  # (B, Dk + 1, S)

    def score(self, query, keys):
        return self.query_proj(query) @ keys[:, :-1] + keys[:, -1:]  # (B, T, S)


def test_user_defined_scorers_keep_their_context():
    model = random_luong_model()
    model.decoder.attention.scorer = PositionBiasScorer(query_dim=16, key_dim=16)
    assert not can_project_context(model.decoder)
    folded = fold_embeddings(model)
    assert folded.decoder.attention is model.decoder.attention
    src, src_lengths = sources()
    options = {"beam_size": 3, "max_len_a": 1.0, "max_len_b": 3}
    expected = beam_search(model, src, src_lengths, **options)
    got = beam_search(folded, src, src_lengths, **options)
    assert [n[0].tokens for n in got] == [n[0].tokens for n in expected]


def test_ensembles_and_shortlists_decode_as_the_unfolded_model():
    members = [random_luong_model(), random_luong_model(attention="multihead", seed=1),
               random_luong_model(attention="dot", seed=2)]
    ensemble = Ensemble(members)
    folded = fold_embeddings(members[0]), fold_embeddings(members[1]), fold_embeddings(members[2])
    assert [type(m.decoder.attention).__name__ for m in folded] == [
        "ProjectedContextAttention", "Attention", "ProjectedContextAttention"]
    ids = torch.tensor([0, 1, 2, 3, *range(5, 20, 2)])  # a shortlist: special ids, then some
    src, src_lengths = sources()
    options = {"beam_size": 3, "nbest": 2, "max_len_a": 1.0, "max_len_b": 3}
    for model, decoded in ((ensemble, Ensemble(list(folded))),
                           (restrict(ensemble, ids), restrict(Ensemble(list(folded)), ids))):
        expected = beam_search(model, src, src_lengths, **options)
        got = beam_search(decoded, src, src_lengths, **options)
        assert_same_hypotheses(got, expected)


def test_projecting_leaves_the_model_alone():
    model = random_luong_model().train()
    model.decoder.attention.eval()  # a flag the fold must not touch
    folded = fold_embeddings(model)
    assert model.training and not model.decoder.attention.training
    assert folded.decoder.attention.training and folded.decoder.combine.state_proj.training
    eval_folded = fold_embeddings(model.eval())
    assert not eval_folded.decoder.combine.training
    assert not eval_folded.decoder.combine.state_proj.training
    assert not eval_folded.decoder.attention.context_proj.training
    assert folded.decoder.attention.normalizer == model.decoder.attention.normalizer


def test_without_projected_context_gives_back_the_decoders_own_modules():
    model = random_luong_model()
    folded = fold_embeddings(model)
    plain = without_projected_context(folded)
    assert plain.decoder.attention is model.decoder.attention
    assert plain.decoder.combine is model.decoder.combine
    assert plain.decoder.embedding is folded.decoder.embedding  # still folded otherwise
    assert plain.encoder is folded.encoder
    assert type(folded.decoder.attention) is ProjectedContextAttention  # left as it was
    assert without_projected_context(model) is model
    ensemble = Ensemble([folded, random_luong_model(attention="multihead")])
    members = without_projected_context(ensemble).members
    assert members[0].decoder.attention is model.decoder.attention
    assert members[1] is ensemble.members[1]


def test_translators_project_for_beam_search_only(monkeypatch):
    seen = []
    for search in (greedy_search, beam_search):

        def spy(model, *args, _search=search, **kwargs):
            seen.append(type(model.decoder.attention).__name__)
            return _search(model, *args, **kwargs)

        monkeypatch.setattr(f"seq2seq.inference.translator.{search.__name__}", spy)
    translator = Translator(random_luong_model(), tokenizers=None, device="cpu", beam_size=1)
    translator.translate_ids([[5, 6, 7]])
    translator.beam_size = 3  # as tune_decoding.py changes it
    translator.translate_ids([[5, 6, 7]])
    assert seen == ["Attention", "ProjectedContextAttention"]


def test_int8_quantizes_both_halves():
    from torch.ao.nn.quantized.dynamic import Linear as QuantizedLinear

    model = random_luong_model()
    quantized = quantize_for_cpu(fold_embeddings(model), "int8")
    assert type(quantized.decoder.attention.context_proj) is QuantizedLinear
    assert type(quantized.decoder.combine.state_proj) is QuantizedLinear
    src, src_lengths = sources()
    tgt_in = torch.randint(4, 20, (src.size(0), 6), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want, _ = model(src, src_lengths, tgt_in)
        have, _ = quantized(src, src_lengths, tgt_in)
    assert (have - want).abs().max() < 0.05 * want.abs().max()  # int8 rounding only
