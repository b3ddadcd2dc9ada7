"""The source encoder: embeddings, then a (bidirectional) GRU or LSTM that never reads padding.

A bidirectional layer is two RNNs (Schuster & Paliwal, 1997): one reads each sentence left to
right, the other right to left, from its last real position; their outputs are concatenated.
Both run over the padded batch, the backward one over each row reversed within its length, so
padding only ever follows a row's real positions and changes none of their outputs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

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


def reversal_index(lengths: Tensor, total_length: int) -> Tensor:
    """Where each position comes from when every row is reversed within its length.

    Row b maps t -> lengths[b] - 1 - t for t < lengths[b] and leaves padding in place, so
    gathering with it twice gives back the input.

    Shape:
        - lengths: (B,), on the device of the result
        - output: (B, S) with S = ``total_length``
    """
    positions = torch.arange(total_length, device=lengths.device).unsqueeze(0)  # (1, S)
    last = lengths.unsqueeze(1) - 1  # (B, 1)
    return torch.where(positions <= last, last - positions, positions)


def reverse_rows(values: Tensor, index: Tensor) -> Tensor:
    """``values`` (B, S, D) with each row reversed within its length (``index`` from
    :func:`reversal_index`)."""
    return values.gather(1, index.unsqueeze(-1).expand(-1, -1, values.size(-1)))


class RNNEncoder(nn.Module):
    """Embedding + GRU/LSTM encoder whose outputs never depend on padding.

    Args:
        hidden_size: RNN hidden size per direction.
        rnn_type: ``"gru"`` or ``"lstm"``.
        dropout: dropout on the embeddings, between layers and on the output.

    Shape:
        - src: (B, S) token ids, padded with ``padding_idx``
        - src_lengths: (B,) real lengths, on any device
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
        self.num_directions = 2 if bidirectional else 1
        self.output_size = hidden_size * self.num_directions
        # layers[l][0] reads left to right, layers[l][1] (bidirectional) right to left.
        self.layers = nn.ModuleList(
            nn.ModuleList(
                make_rnn(rnn_type, input_size=embed_dim if layer == 0 else self.output_size,
                         hidden_size=hidden_size)
                for _ in range(self.num_directions)
            )
            for layer in range(num_layers)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, src: Tensor, src_lengths: Tensor) -> EncoderOutput:
        lengths = src_lengths.to(src.device)
        mask = source_mask(lengths, src.size(1))  # (B, S)
        reverse = reversal_index(lengths, src.size(1))  # (B, S)
        layer_input = self.dropout(self.embedding(src))  # (B, S, E)
        for number, directions in enumerate(self.layers):
            if number > 0:
                layer_input = self.dropout(layer_input)
            outputs = [directions[0](layer_input)[0]]  # (B, S, H)
            if len(directions) == 2:
                backward = directions[1](reverse_rows(layer_input, reverse))[0]
                outputs.append(reverse_rows(backward, reverse))  # back in source order
            layer_input = torch.cat(outputs, dim=-1)  # (B, S, D)
        memory = layer_input * mask.unsqueeze(-1)  # (B, S, D), zeros at padding
        # Each direction's final state: the forward one's at the last real position, the
        # backward one's at position 0, where it ended.
        hidden = layer_input.size(-1) // self.num_directions
        last = (lengths - 1).view(-1, 1, 1).expand(-1, 1, hidden)  # (B, 1, H)
        finals = [layer_input[..., :hidden].gather(1, last).squeeze(1)]  # (B, H)
        if self.num_directions == 2:
            finals.append(layer_input[:, 0, hidden:])
        final = torch.cat(finals, dim=-1)  # (B, D)
        return EncoderOutput(memory=self.dropout(memory), mask=mask, final=final)
