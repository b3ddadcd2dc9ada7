"""seq2seq.export.gru_products: one GRU step as its products, what int8 exports trace.

The swapped decoder's step equals the plain one (two layers, Luong and Bahdanau); an LSTM and
training fall back to the RNN itself; a decoder class with its own RNN step keeps it.
"""

from __future__ import annotations

import pytest
import torch
from test_ops import batch, tiny_model

from seq2seq.data.vocab import BOS_ID
from seq2seq.export.gru_products import GRUStepProducts, gru_steps_as_products
from seq2seq.models.attention import Attention, DotScorer
from seq2seq.models.decoders import BahdanauDecoder


def first_steps(model, steps: int = 3):
    """``steps`` greedy decoder steps of ``model`` from BOS: logits, weights, state each."""
    src, src_lengths, _ = batch()
    outputs = []
    with torch.no_grad():
        encoded = model.encode(src, src_lengths)
        state = model.init_state(encoded)
        prev = torch.full((src.size(0),), BOS_ID)
        for _ in range(steps):
            logits, weights, state = model.decode_step(prev, state, encoded)
            outputs.append((logits, weights, dict(state)))
            prev = logits.argmax(-1)
    return outputs


@pytest.mark.parametrize("decoder", ["luong", "bahdanau"])
def test_a_gru_step_as_products_is_the_gru_step(decoder):
    """Two layers (test_ops' models): the second layer's input is the first's new state."""
    plain = tiny_model(decoder, "additive").double().eval()
    swapped = gru_steps_as_products(plain)
    assert isinstance(swapped.decoder, GRUStepProducts) and type(plain.decoder) is not type(
        swapped.decoder)  # a copy: the model given stays as it was
    assert type(swapped.decoder).__name__ == type(plain.decoder).__name__
    for got, want in zip(first_steps(swapped), first_steps(plain), strict=True):
        torch.testing.assert_close(got, want)


def test_an_lstm_and_training_run_the_rnn_itself(monkeypatch):
    lstm = gru_steps_as_products(tiny_model("luong", "additive", rnn_type="lstm").eval())
    gru = gru_steps_as_products(tiny_model("luong", "additive").eval())
    calls = []
    for model in (lstm, gru):
        monkeypatch.setattr(model.decoder.rnn, "forward", lambda *args, rnn=model.decoder.rnn,
                            **kwargs: calls.append(rnn.mode) or type(rnn).forward(rnn, *args,
                                                                                  **kwargs))
    first_steps(lstm, steps=1)
    assert calls == ["LSTM"]
    calls.clear()
    first_steps(gru, steps=1)
    assert calls == []  # one position of a GRU in eval mode: the products
    gru.train()
    gru.decoder.dropout.p = 0.0
    first_steps(gru, steps=1)
    assert calls == ["GRU"]


def test_a_decoder_class_with_its_own_rnn_step_keeps_it():
    class OwnStep(BahdanauDecoder):
        def _rnn(self, inputs, state):
            return super()._rnn(inputs, state)

    def decoder(cls):
        return cls(vocab_size=10, embed_dim=4, hidden_size=8, num_layers=1,
                   attention=Attention(DotScorer(query_dim=8, key_dim=8)),
                   encoder_output_size=8, encoder_final_size=8)

    assert type(gru_steps_as_products(decoder(OwnStep))) is OwnStep
    assert isinstance(gru_steps_as_products(decoder(BahdanauDecoder)), GRUStepProducts)
