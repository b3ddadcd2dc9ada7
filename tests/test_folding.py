"""Encoder and decoder embeddings folded into their RNNs' input gates
(seq2seq/inference/folding.py)."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import assert_same_hypotheses, padded_random_sources, random_luong_model
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from seq2seq.inference import folding
from seq2seq.inference.ensemble import Ensemble
from seq2seq.inference.folding import (
    FoldedEncoder,
    FoldedRNN,
    GateTable,
    can_fold,
    can_fold_decoder,
    can_fold_encoder,
    fold_embeddings,
    fold_for_decoding,
)
from seq2seq.inference.projected_context import ProjectedContextAttention
from seq2seq.inference.quantize import quantize_for_cpu
from seq2seq.inference.search import beam_search, greedy_search
from seq2seq.inference.translator import Translator

VOCAB = 20
luong_model = functools.partial(random_luong_model, vocab=VOCAB)


def sources():
    return padded_random_sources(9, vocab=VOCAB, max_len=8, seed=3)


def batch():
    """:func:`sources` with random target inputs of 6 steps."""
    src, src_lengths = sources()
    tgt_in = torch.randint(4, VOCAB, (src.size(0), 6), generator=torch.Generator().manual_seed(5))
    return src, src_lengths, tgt_in


@pytest.fixture(autouse=True)
def fold_every_batch(monkeypatch):
    """The folded encoder for the 9 sentences of :func:`sources` too (its real threshold is
    tested on its own)."""
    monkeypatch.setattr(folding, "MIN_FOLDED_BATCH", 1)


VARIANTS = {
    "gru-input-feeding": {"rnn_type": "gru"},
    "lstm-input-feeding": {"rnn_type": "lstm"},
    "gru-no-feeding": {"rnn_type": "gru", "input_feeding": False},
    "lstm-no-feeding": {"rnn_type": "lstm", "input_feeding": False},
    "gru-one-way-encoder": {"rnn_type": "gru", "bidirectional": False},
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_folded_model_computes_what_the_model_computes(variant):
    model = luong_model(**VARIANTS[variant])
    folded = fold_embeddings(model)
    assert isinstance(folded.decoder.rnn, FoldedRNN) and isinstance(folded.encoder, FoldedEncoder)
    src, src_lengths, tgt_in = batch()
    with torch.no_grad():
        want, have = model.encoder(src, src_lengths), folded.encoder(src, src_lengths)
    for name in ("memory", "mask", "final"):
        torch.testing.assert_close(getattr(have, name), getattr(want, name))
    with torch.no_grad():
        torch.testing.assert_close(folded(src, src_lengths, tgt_in), model(src, src_lengths, tgt_in))
    options = {"max_len_a": 1.0, "max_len_b": 3, "return_attention": True}
    for search in (greedy_search, beam_search):
        extra = {"beam_size": 4, "nbest": 2} if search is beam_search else {}
        expected = search(model, src, src_lengths, **options, **extra)
        got = search(folded, src, src_lengths, **options, **extra)
        assert len({len(n_best[0].tokens) for n_best in expected}) > 1  # mixed lengths
        assert_same_hypotheses(got, expected)


def test_folding_leaves_the_model_alone_and_shares_the_rest():
    model = luong_model().train()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    folded = fold_embeddings(model)
    assert folded is not model and folded.decoder is not model.decoder
    assert type(model.decoder.rnn) is nn.GRU and type(model.encoder.rnn) is nn.GRU
    assert model.decoder.embedding.weight.shape == (VOCAB, 12)
    ids = torch.tensor([1, 2])
    assert folded.decoder.embedding(ids).shape == (2, 3 * 16)  # the GRU's input gates
    assert [table(ids).shape for table in folded.encoder.gates] == [(2, 3 * 8)] * 2
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, before[name], rtol=0, atol=0)
    # Nothing else is copied, and the training flags stay as they were.
    assert folded.generator is model.generator
    assert folded.decoder.attention.attention is model.decoder.attention  # wrapped, not copied
    assert model.training and model.decoder.training and model.encoder.training
    assert folded.decoder.training and folded.encoder.training


def test_a_step_skips_the_embedding_product():
    model = luong_model()
    folded = fold_embeddings(model)
    src, src_lengths = sources()
    rows = src.size(0)

    @torch.no_grad()
    def step_flops(m):
        encoded = m.encode(src, src_lengths)
        state = m.init_state(encoded)
        m.decode_step(torch.full((rows,), 5), state, encoded)  # fills the table's row 5
        with FlopCounterMode(display=False) as counter:
            m.decode_step(torch.full((rows,), 5), state, encoded)
        return counter.get_total_flops()

    embed_dim, gates, context, output = 12, 3 * 16, 16, 16
    # The embedding's product, and combine's context half (done on the memory, at encoding).
    saved = 2 * rows * embed_dim * gates + 2 * rows * context * output
    assert step_flops(model) - step_flops(folded) == saved


def test_gate_tables_compute_the_rows_looked_up_once():
    torch.manual_seed(0)
    embedding, weight, bias = torch.randn(10, 4), torch.randn(6, 4), torch.randn(6)
    with torch.inference_mode():  # rows filled inside and outside it
        table = GateTable(embedding=embedding, weight=weight, bias=bias)
    ids = torch.tensor([[3, 7, 3], [0, 3, 9]])
    with FlopCounterMode(display=False) as counter:
        gates = table(ids)
    assert counter.get_total_flops() == 2 * 4 * 4 * 6  # ids 0, 3, 7, 9: one row each
    torch.testing.assert_close(gates, embedding[ids] @ weight.T + bias)
    assert table.known.nonzero().flatten().tolist() == [0, 3, 7, 9]
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        gates = table(torch.tensor([9, 1]))
    assert counter.get_total_flops() == 2 * 4 * 6  # row 1 only
    torch.testing.assert_close(gates, embedding[[9, 1]] @ weight.T + bias)


def test_the_folded_copy_keeps_the_weights_it_was_folded_with():
    model = luong_model()
    folded = fold_embeddings(model)
    src, src_lengths, tgt_in = batch()
    with torch.no_grad():
        want, _ = model(src, src_lengths, tgt_in)
        for parameter in model.parameters():  # training goes on after folding
            parameter.add_(0.5)
        have, _ = folded(src, src_lengths, tgt_in)  # the tables' rows are computed now
    assert (have - want).abs().max() > 0  # not all of it is a snapshot (shared output layer)...
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.sub_(0.5)
        torch.testing.assert_close(folded(src, src_lengths, tgt_in)[0], want)  # ...the tables are


def test_gate_tables_follow_the_weights_dtype_not_the_default():
    model = luong_model()
    src, src_lengths = sources()
    with torch.no_grad():
        want = model.encoder(src, src_lengths).memory
        torch.set_default_dtype(torch.float64)
        try:
            folded = fold_embeddings(model)
            have = folded.encoder(src, src_lengths).memory
        finally:
            torch.set_default_dtype(torch.float32)
    assert have.dtype == torch.float32
    torch.testing.assert_close(have, want)


def test_small_batches_are_encoded_unfolded(monkeypatch):
    monkeypatch.setattr(folding, "MIN_FOLDED_BATCH", 10)
    model = luong_model()
    folded = fold_embeddings(model)
    src, src_lengths = sources()  # 9 sentences

    @torch.no_grad()
    def encode_flops(m, rows):
        with FlopCounterMode(display=False) as counter:
            m.encoder(src[:rows], src_lengths[:rows])
        return counter.get_total_flops()

    assert encode_flops(folded, 9) == encode_flops(model, 9)
    monkeypatch.setattr(folding, "MIN_FOLDED_BATCH", 9)
    with torch.no_grad():
        folded.encoder(src, src_lengths)  # fills the tables' rows
    assert encode_flops(folded, 9) < encode_flops(model, 9)


def test_encoding_skips_the_embedding_product():
    model = luong_model()
    folded = fold_embeddings(model)
    src, src_lengths = sources()

    @torch.no_grad()
    def encode_flops(m):
        m.encode(src, src_lengths)  # fills the tables' rows
        with FlopCounterMode(display=False) as counter:
            m.encode(src, src_lengths)
        return counter.get_total_flops()

    embed_dim, gates, directions, context, output = 12, 3 * 8, 2, 16, 16
    saved = 2 * src.numel() * embed_dim * gates * directions
    added = 2 * src.numel() * context * output  # combine's context half of the memory
    assert encode_flops(model) - encode_flops(folded) == saved - added


@pytest.mark.parametrize(
    "options",
    [{"dtype": torch.float64}, {"table_bytes": 1000, "attention": "multihead"}],
    ids=["float64", "tables-too-big"],  # multi-head: no projected context either
)
def test_models_that_cannot_fold_are_left_as_they_are(options, monkeypatch):
    dtype = options.pop("dtype", None)
    if "table_bytes" in options:  # VOCAB x 3H float32: 3,840 bytes (decoder), 2 x 1,920 (encoder)
        monkeypatch.setattr(folding, "MAX_TABLE_BYTES", options.pop("table_bytes"))
    model = luong_model(**options)
    if dtype is not None:
        model = model.to(dtype)
    assert not can_fold(model)
    assert fold_embeddings(model) is model


def test_bahdanau_decoders_are_left_as_they_are_beside_a_folded_encoder():
    model = luong_model(decoder="bahdanau")
    assert not can_fold_decoder(model.decoder) and can_fold(model)
    folded = fold_embeddings(model)
    assert folded.decoder is model.decoder and isinstance(folded.encoder, FoldedEncoder)


def test_deeper_luong_decoders_keep_their_rnn_and_get_the_projected_context():
    model = luong_model(num_layers=2)
    assert not can_fold_decoder(model.decoder)
    folded = fold_embeddings(model)
    assert folded.decoder.rnn is model.decoder.rnn and isinstance(folded.encoder, FoldedEncoder)
    assert folded.decoder.embedding is model.decoder.embedding
    assert isinstance(folded.decoder.attention, ProjectedContextAttention)


def test_the_table_limit_applies_to_the_encoder_and_the_decoder_apart(monkeypatch):
    # A one-way encoder's table: VOCAB x 3 x 8 float32 = 1,920 bytes; the decoder's 3,840.
    monkeypatch.setattr(folding, "MAX_TABLE_BYTES", 2000)
    model = luong_model(bidirectional=False)
    folded = fold_embeddings(model)
    assert isinstance(folded.encoder, FoldedEncoder) and folded.decoder.rnn is model.decoder.rnn


def test_deeper_encoders_are_left_unfolded_beside_a_folded_decoder():
    model = luong_model(encoder_layers=2)
    assert not can_fold_encoder(model.encoder)
    folded = fold_embeddings(model)
    assert folded.encoder is model.encoder and isinstance(folded.decoder.rnn, FoldedRNN)


def test_translators_fold_float32_searches_on_the_cpu_only():
    model = luong_model()
    fp32 = {"autocast_dtype": None}
    assert isinstance(fold_for_decoding(model, device="cpu", **fp32).decoder.rnn, FoldedRNN)
    assert fold_for_decoding(model, device="meta", **fp32) is model  # not the CPU
    assert fold_for_decoding(model, device="cpu", autocast_dtype=torch.bfloat16) is model
    ensemble = fold_for_decoding(Ensemble([model, luong_model(seed=1)]), device="cpu", **fp32)
    assert all(isinstance(member.decoder.rnn, FoldedRNN) for member in ensemble.members)
    translator = Translator(model, tokenizers=None, device="cpu", beam_size=2)
    assert isinstance(translator.model.decoder.rnn, FoldedRNN)
    assert isinstance(translator.model.encoder, FoldedEncoder)
    assert type(model.decoder.rnn) is nn.GRU
    assert translator.parameter_count == sum(p.numel() for p in model.parameters())
    bf16 = Translator(model, tokenizers=None, device="cpu", beam_size=2, precision="bf16")
    assert bf16.model is model
    assert Translator(model, tokenizers=None, device="cpu", fold=False).model is model


def test_an_unknown_quantize_mode_is_refused_before_any_work():
    with pytest.raises(ValueError, match="quantize must be one of none, int8, got 'int4'"):
        Translator(luong_model(), tokenizers=None, device="cpu", quantize="int4")


@pytest.mark.parametrize("rnn_type", ["gru", "lstm"])
def test_int8_quantizes_the_folded_products(rnn_type):
    from torch.ao.nn.quantized.dynamic import Linear as QuantizedLinear

    model = luong_model(rnn_type)
    quantized = quantize_for_cpu(fold_embeddings(model), "int8")
    rnn = quantized.decoder.rnn
    assert type(rnn.rest_proj) is QuantizedLinear and type(rnn.hidden_proj) is QuantizedLinear
    assert all(type(rnn.hidden_proj) is QuantizedLinear for rnn in quantized.encoder.rnns)
    assert all(table.rows is None for table in quantized.encoder.gates)  # the copy copied none
    src, src_lengths, tgt_in = batch()
    with torch.no_grad():
        want, _ = model(src, src_lengths, tgt_in)
        have, _ = quantized(src, src_lengths, tgt_in)
    assert (have - want).abs().max() < 0.05 * want.abs().max()  # int8 rounding only


def test_bf16_autocast_decodes_close_to_float32():
    model = luong_model()
    folded = fold_embeddings(model)
    src, src_lengths, tgt_in = batch()
    with torch.no_grad():
        want, _ = model(src, src_lengths, tgt_in)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            have, _ = folded(src, src_lengths, tgt_in)
    assert (have.float() - want).abs().max() < 0.05
