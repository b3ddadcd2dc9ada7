"""The source encoder: embeddings, then a (bidirectional) GRU or LSTM that never reads padding.

The RNN runs over packed sequences (``pack_padded_sequence``), so each direction stops at a
row's last real position and the backward direction starts there.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

RNN_TYPES = {"gru": nn.GRU, "lstm": nn.LSTM}


def make_rnn(rnn_type: str, **kwargs) -> nn.RNNBase:
    """Build ``nn.GRU`` or ``nn.LSTM`` by name, with a clear error for anything else."""
    if rnn_type not in RNN_TYPES:
        raise ValueError(f"rnn_type must be one of {sorted(RNN_TYPES)}, got {rnn_type!r}")
    return RNN_TYPES[rnn_type](batch_first=True, **kwargs)


class EncoderOutput(NamedTuple):
    """What the encoder hands to the decoder.

    Attributes:
        memory: one vector per source position, zeros at padding. Shape (B, S, D).
        mask: True at real source positions. Shape (B, S).
        final: the last layer's final state, both directions concatenated. Shape (B, D).
    """

    memory: Tensor
    mask: Tensor
    final: Tensor


def source_mask(lengths: Tensor, total_length: int) -> Tensor:
    """True at the real positions of each row: (B,) lengths -> (B, S), S = ``total_length``."""
    positions = torch.arange(total_length, device=lengths.device)
    return positions.unsqueeze(0) < lengths.unsqueeze(1)


class RNNEncoder(nn.Module):
    """Embedding + GRU/LSTM encoder whose outputs never depend on padding.

    Args:
        vocab_size: source vocabulary size.
        embed_dim: embedding size.
        hidden_size: RNN hidden size per direction.
        num_layers: stacked RNN layers.
        rnn_type: ``"gru"`` or ``"lstm"``.
        bidirectional: read the source in both directions.
        dropout: dropout on the embeddings, between layers and on the output.
        padding_idx: id of the padding token.

    Shape:
        - src: (B, S) token ids, padded with ``padding_idx``
        - src_lengths: (B,) real lengths, on the CPU
        - output: :class:`EncoderOutput` with memory (B, S, output_size), mask (B, S),
          final (B, output_size)
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        embed_dim: int,
        hidden_size: int,
        num_layers: int = 1,
        rnn_type: str = "gru",
        bidirectional: bool = True,
        dropout: float = 0.0,
        padding_idx: int = 0,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=padding_idx)
        self.rnn = make_rnn(
            rnn_type,
            input_size=embed_dim,
            hidden_size=hidden_size,
            num_layers=num_layers,
            bidirectional=bidirectional,
            dropout=dropout if num_layers > 1 else 0.0,
        )
        self.dropout = nn.Dropout(dropout)
        self.num_directions = 2 if bidirectional else 1
        self.output_size = hidden_size * self.num_directions

    def forward(self, src: Tensor, src_lengths: Tensor) -> EncoderOutput:
        batch_size, src_len = src.shape
        embedded = self.dropout(self.embedding(src))  # (B, S, E)
        packed = pack_padded_sequence(
            embedded, src_lengths.cpu(), batch_first=True, enforce_sorted=False
        )
        packed_out, state = self.rnn(packed)
        # total_length keeps S even when the longest sentence of the batch is shorter than S.
        memory, _ = pad_packed_sequence(packed_out, batch_first=True, total_length=src_len)
        hidden = state[0] if isinstance(state, tuple) else state  # LSTM: (h, c); keep h
        # (L * dirs, B, H) -> the last layer's directions -> (B, dirs * H)
        last = hidden.view(-1, self.num_directions, batch_size, hidden.size(-1))[-1]
        final = last.transpose(0, 1).reshape(batch_size, self.output_size)
        mask = source_mask(src_lengths.to(src.device), src_len)  # (B, S)
        return EncoderOutput(memory=self.dropout(memory), mask=mask, final=final)
