"""The encoder never reads padding: a sentence encodes the same alone and in a padded batch."""

from __future__ import annotations

import itertools

import pytest
import torch

from seq2seq.models.encoder import RNNEncoder

SHAPES = list(itertools.product(["gru", "lstm"], [1, 2], [True, False]))


def make_encoder(rnn_type: str, num_layers: int, bidirectional: bool, *, dropout: float = 0.0):
    torch.manual_seed(0)
    return RNNEncoder(vocab_size=30, embed_dim=8, hidden_size=6, num_layers=num_layers,
                      rnn_type=rnn_type, bidirectional=bidirectional, dropout=dropout)


def padded_batch():
    """Five rows of lengths 7, 3, 5, 1, 6 in a batch two positions wider than the longest."""
    lengths = torch.tensor([7, 3, 5, 1, 6])
    src = torch.randint(4, 30, (5, 9), generator=torch.Generator().manual_seed(1))
    src[torch.arange(9) >= lengths.unsqueeze(1)] = 0
    return src, lengths


@pytest.mark.parametrize(("rnn_type", "num_layers", "bidirectional"), SHAPES)
def test_each_row_encodes_as_it_does_alone(rnn_type, num_layers, bidirectional):
    encoder = make_encoder(rnn_type, num_layers, bidirectional).eval()
    src, lengths = padded_batch()
    with torch.no_grad():
        batch = encoder(src, lengths)
        assert batch.memory.shape == (5, 9, encoder.output_size)
        assert batch.final.shape == (5, encoder.output_size)
        assert not batch.memory[~batch.mask].any()  # zeros at padding
        for row, length in enumerate(lengths.tolist()):
            alone = encoder(src[row : row + 1, :length], lengths[row : row + 1])
            torch.testing.assert_close(batch.memory[row, :length], alone.memory[0], atol=1e-6,
                                       rtol=0)
            torch.testing.assert_close(batch.final[row], alone.final[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("rnn_type", ["gru", "lstm"])
def test_final_state_is_each_directions_last_step(rnn_type):
    encoder = make_encoder(rnn_type, 1, True).eval()
    src, lengths = padded_batch()
    with torch.no_grad():
        out = encoder(src, lengths)
    hidden = encoder.output_size // 2
    last = (lengths - 1).tolist()
    forward_ends = torch.stack([out.memory[row, end, :hidden] for row, end in enumerate(last)])
    torch.testing.assert_close(out.final[:, :hidden], forward_ends)
    torch.testing.assert_close(out.final[:, hidden:], out.memory[:, 0, hidden:])


def test_padding_gets_no_gradient_and_changes_nothing():
    encoder = make_encoder("gru", 2, True).train()
    src, lengths = padded_batch()
    torch.manual_seed(3)
    first = encoder(src, lengths)
    wider = torch.cat([src, torch.zeros(5, 3, dtype=src.dtype)], dim=1)  # more padding
    torch.manual_seed(3)
    second = encoder(wider, lengths)
    assert second.memory.shape[1] == 12
    torch.testing.assert_close(second.memory[:, :9], first.memory)
    torch.testing.assert_close(second.final, first.final)
    second.memory.sum().backward()
    assert torch.isfinite(encoder.embedding.weight.grad).all()


@pytest.mark.parametrize("rnn_type", ["gru", "lstm"])
def test_two_layer_bidirectional_encoder_is_torchs_bidirectional_rnn(rnn_type):
    """The per-direction layers compute what one bidirectional nn.GRU/LSTM computes on each
    unpadded sentence, with the same weights (the names its checkpoints used, upgraded)."""
    from torch import nn

    from seq2seq.checkpoint import upgrade_model_keys

    encoder = make_encoder(rnn_type, 2, True).eval()
    reference = getattr(nn, rnn_type.upper())(8, 6, num_layers=2, bidirectional=True,
                                               batch_first=True)
    old_keys = {f"encoder.rnn.{name}": value for name, value in reference.state_dict().items()}
    upgraded = {key.removeprefix("encoder."): value
                for key, value in upgrade_model_keys(old_keys).items()}
    missing, unexpected = encoder.load_state_dict(upgraded, strict=False)
    assert missing == ["embedding.weight"] and unexpected == []
    src, lengths = padded_batch()
    with torch.no_grad():
        out = encoder(src, lengths)
        for row, length in enumerate(lengths.tolist()):
            expected = reference(encoder.embedding(src[row : row + 1, :length]))[0]
            torch.testing.assert_close(out.memory[row, :length], expected[0], atol=1e-6, rtol=0)
