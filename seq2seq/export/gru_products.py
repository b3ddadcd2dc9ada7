"""One GRU step as its matrix products, so that ``quantize=int8`` reaches the GRU.

A GRU exports as one ONNX ``GRU`` node, and ONNX Runtime's dynamic quantization, which
quantizes ``MatMul`` and ``Gemm`` nodes, leaves it in fp32: in an int8 export the decoder
step's GRU was its costliest part (docs/speed.md). A decoder step runs the GRU over one
position, where each layer is two products and a few element-wise operations (``torch.nn.GRU``'s
equations):

    r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
    z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
    n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
    h' = (1 - z) * n + z * h

Written so, the export has two ``Gemm`` nodes a layer that the quantizer turns into int8.
These are the GRU's own equations, not a speed kernel of :mod:`seq2seq.ops`: only an int8
export traces them (:func:`gru_steps_as_products`), on a copy of the model; training and
PyTorch decoding keep ``torch.nn.GRU``.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.mixins import mix_into
from seq2seq.models.decoders import AttentionDecoder
from seq2seq.models.interfaces import State


class GRUStepProducts:
    """Mixin over :class:`~seq2seq.models.decoders.AttentionDecoder`: ``_rnn`` of one position
    of a unidirectional GRU, in eval mode, as the products above; anything else (an LSTM,
    several positions, training with dropout between layers) as before."""

    def _rnn(self, inputs: Tensor, state: State) -> tuple[Tensor, State]:
        rnn = self.rnn
        if rnn.mode != "GRU" or self.training or inputs.size(1) != 1 or rnn.bidirectional:
            return super()._rnn(inputs, state)
        x = inputs[:, 0]  # (B, I)
        hidden = state["hidden"]  # (B, L, H)
        layers = []
        for layer in range(rnn.num_layers):
            h = hidden[:, layer]  # (B, H)
            gates_x = F.linear(x, getattr(rnn, f"weight_ih_l{layer}"),
                               getattr(rnn, f"bias_ih_l{layer}", None))  # (B, 3H)
            gates_h = F.linear(h, getattr(rnn, f"weight_hh_l{layer}"),
                               getattr(rnn, f"bias_hh_l{layer}", None))  # (B, 3H)
            x_r, x_z, x_n = gates_x.chunk(3, dim=-1)
            h_r, h_z, h_n = gates_h.chunk(3, dim=-1)
            r = torch.sigmoid(x_r + h_r)
            z = torch.sigmoid(x_z + h_z)
            n = torch.tanh(x_n + r * h_n)
            x = (1 - z) * n + z * h  # the next layer's input
            layers.append(x)
        return x.unsqueeze(1), {"hidden": torch.stack(layers, dim=1)}  # (B, 1, H), (B, L, H)


def gru_steps_as_products(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose attention decoders run a step's GRU as :class:`GRUStepProducts`
    (a decoder class with its own ``_rnn`` keeps it); the same parameters' values, names and
    outputs."""
    return mix_into(copy.deepcopy(model), AttentionDecoder, GRUStepProducts, ("_rnn",))
