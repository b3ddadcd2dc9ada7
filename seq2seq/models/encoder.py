"""The source encoder: embeddings, then a (bidirectional) GRU or LSTM that never reads padding.

On the CPU each direction of each layer runs as one call over the padded batch, the backward
direction over every row reversed within its length, so padding only ever follows a row's real
positions and is masked out. That is what packed sequences compute, without their cost on the
CPU: a packed run projects its input a time step at a time, on sub-batches whose sizes change
with every batch, and under bf16 autocast oneDNN builds a kernel for each new size. Elsewhere
(CUDA, where cuDNN runs packed sequences well) and for quantized recurrent layers, which take
packed input, the encoder packs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from seq2seq.models.dropout import Dropout
from seq2seq.models.dropout import dropout as functional_dropout

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


def gather_rows(values: Tensor, index: Tensor) -> Tensor:
    """``values`` (B, S, D) reordered along S by ``index`` (B, S)."""
    return values.gather(1, index.unsqueeze(-1).expand(-1, -1, values.size(-1)))


def final_states(output: Tensor, lengths: Tensor, num_directions: int) -> Tensor:
    """The final state of each direction of a run over the padded batch (see
    :meth:`RNNEncoder._run_padded`): the forward direction's is its output at the last real
    position, the backward direction's its output at position 0, where it ended.

    Shape:
        - output: (B, S, num_directions * H); lengths: (B,), on the device of ``output``
        - result: (B, num_directions * H)
    """
    batch_size = output.size(0)
    hidden = output.size(-1) // num_directions
    last = (lengths - 1).view(batch_size, 1, 1).expand(-1, 1, hidden)
    finals = [output[..., :hidden].gather(1, last).squeeze(1)]  # (B, H)
    if num_directions == 2:
        finals.append(output[:, 0, hidden:])
    return torch.cat(finals, dim=-1)


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
        self.dropout = Dropout(dropout)
        self.num_directions = 2 if bidirectional else 1
        self.output_size = hidden_size * self.num_directions

    def forward(self, src: Tensor, src_lengths: Tensor) -> EncoderOutput:
        src_len = src.size(1)
        embedded = self.dropout(self.embedding(src))  # (B, S, E)
        lengths = src_lengths.to(src.device)
        mask = source_mask(lengths, src_len)  # (B, S)
        # type() rather than isinstance: quantized GRU/LSTM modules are not nn.GRU/nn.LSTM.
        if src.device.type == "cpu" and type(self.rnn) in RNN_TYPES.values():
            memory, final = self._run_padded(embedded, lengths, mask)
        else:
            memory, final = self._run_packed(embedded, src_lengths)
        return EncoderOutput(memory=self.dropout(memory), mask=mask, final=final)

    def _run_packed(self, embedded: Tensor, src_lengths: Tensor) -> tuple[Tensor, Tensor]:
        """The RNN over packed sequences: memory (B, S, D), zeros at padding, and final (B, D)."""
        batch_size, src_len, _ = embedded.shape
        packed = pack_padded_sequence(
            embedded, src_lengths.cpu(), batch_first=True, enforce_sorted=False
        )
        packed_out, state = self.rnn(packed)
        # total_length keeps S even when the longest sequence in the batch is shorter than S.
        memory, _ = pad_packed_sequence(packed_out, batch_first=True, total_length=src_len)
        hidden = state[0] if isinstance(state, tuple) else state  # LSTM: (h, c); keep h
        # (L * dirs, B, H) -> last layer's directions -> (B, dirs * H)
        last = hidden.view(-1, self.num_directions, batch_size, hidden.size(-1))[-1]
        return memory, last.transpose(0, 1).reshape(batch_size, self.output_size)

    def _run_padded(self, embedded: Tensor, lengths: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """What :meth:`_run_packed` returns, from one RNN call per layer and direction over the
        padded batch (the backward direction reads each row reversed within its length)."""
        rnn = self.rnn
        batch_size, src_len, _ = embedded.shape
        reverse = reversal_index(lengths, src_len)  # (B, S)
        layer_input = embedded
        for layer in range(rnn.num_layers):
            outputs = []
            for direction in range(self.num_directions):
                suffix = "_reverse" if direction else ""
                names = [f"weight_ih_l{layer}{suffix}", f"weight_hh_l{layer}{suffix}"]
                if rnn.bias:
                    names += [f"bias_ih_l{layer}{suffix}", f"bias_hh_l{layer}{suffix}"]
                weights = [getattr(rnn, name) for name in names]
                inputs = gather_rows(layer_input, reverse) if direction else layer_input
                zeros = inputs.new_zeros(1, batch_size, rnn.hidden_size)
                # One layer, one direction of nn.GRU / nn.LSTM: the call their forward makes.
                if isinstance(rnn, nn.LSTM):
                    output = torch._VF.lstm(inputs, (zeros, zeros), weights, rnn.bias, 1, 0.0,
                                            self.training, False, True)[0]
                else:
                    output = torch._VF.gru(inputs, zeros, weights, rnn.bias, 1, 0.0,
                                           self.training, False, True)[0]
                outputs.append(gather_rows(output, reverse) if direction else output)  # (B, S, H)
            layer_input = torch.cat(outputs, dim=-1)  # (B, S, D)
            if layer < rnn.num_layers - 1:
                layer_input = functional_dropout(layer_input, rnn.dropout, self.training)
        memory = layer_input * mask.unsqueeze(-1)  # zeros at padding, like pad_packed_sequence
        return memory, final_states(layer_input, lengths, self.num_directions)
