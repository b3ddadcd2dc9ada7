"""The decoder's target embeddings folded into its RNN's input gates, for decoding on the CPU.

A Luong decoder's RNN reads ``x_t = [e(y_{t-1}); a_{t-1}]`` (or ``e(y_{t-1})`` alone without
input feeding), so the first product of every step is
``W_ih x_t + b_ih = (W_e e(y_{t-1}) + b_ih) + W_a a_{t-1}``. The bracket depends on the previous
token only: it is one row of the table ``T = E W_e^T + b_ih`` (V, G), G = 3H for a GRU and 4H
for an LSTM, computed once per model. :func:`fold_embeddings` returns a shallow copy of the
model in which

- the decoder's embedding is that table (``nn.Embedding(V, G)``), so a step looks its gates up
  instead of multiplying ``W_e`` by an embedding: a quarter of the GRU's products in
  ``multi30k_best`` (E = 256 of the 768 inputs; 8% of a search's FLOP);
- the decoder's RNN is a :class:`FoldedRNN`: the folded gates plus ``W_a a_{t-1}`` and the
  recurrent product, then the GRU / LSTM cell, in float32.

Translations are the same up to float rounding (tested against the unfolded model); the model
passed in is left as it is, and the copy shares all its other parameters. Only single-layer
float32 GRU/LSTM Luong decoders are folded, with a table of at most :data:`MAX_TABLE_BYTES`:
Bahdanau's decoder also feeds the embedding itself to its output layer, and a deeper RNN would
need the other layers unfolded beside it. :class:`~seq2seq.inference.translator.Translator`
folds for float32 searches on the CPU, before ``quantize=int8`` (which then quantizes the two
products of :class:`FoldedRNN`; the table stays float like every embedding). On a GPU the
cuDNN step is kept, and bf16/fp16 searches keep the model as it is: the folded cell runs in
float32, and that path was not timed on a CPU with bf16 instructions.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from seq2seq.inference.ensemble import Ensemble
from seq2seq.models.decoders import LuongDecoder


class FoldedRNN(nn.Module):
    """A one-layer GRU or LSTM whose input starts with its already-computed input gates.

    Reads ``[g; r]`` per step: ``g`` (G) the folded ``W_e e + b_ih`` gates, ``r`` (R) the rest
    of the original input (``R = 0`` without input feeding). Same call and return conventions
    as the batch-first ``nn.GRU`` / ``nn.LSTM`` it replaces.

    Args:
        rnn_type: ``"gru"`` or ``"lstm"``.
        rest_proj: ``W_a`` (R -> G, no bias), or None when R = 0.
        hidden_proj: ``W_hh`` with ``b_hh`` (H -> G).

    Shape:
        - inputs: (B, T, G + R); hidden: (1, B, H), for an LSTM ``(hidden, cell)``
        - output: (B, T, H) and the last hidden state (1, B, H) (LSTM: with its cell)
    """

    def __init__(self, *, rnn_type: str, rest_proj: nn.Module | None, hidden_proj: nn.Module):
        super().__init__()
        self.is_lstm = rnn_type == "lstm"
        self.rest_proj = rest_proj
        self.hidden_proj = hidden_proj

    def forward(self, inputs: Tensor, hidden):
        hidden, cell = hidden if self.is_lstm else (hidden, None)
        h = hidden[0].float()  # (B, H)
        c = cell[0].float() if cell is not None else None
        gate_size = 4 * h.size(-1) if self.is_lstm else 3 * h.size(-1)  # G
        outputs = []
        for t in range(inputs.size(1)):
            gates = inputs[:, t, :gate_size].float()  # (B, G): W_e e + b_ih, looked up
            if self.rest_proj is not None:
                gates = gates + self.rest_proj(inputs[:, t, gate_size:])
            recurrent = self.hidden_proj(h).float()  # (B, G)
            if self.is_lstm:
                h, c = _lstm_cell(gates, recurrent, c)
            else:
                h = _gru_cell(gates, recurrent, h)
            outputs.append(h)
        output = torch.stack(outputs, dim=1)  # (B, T, H)
        if self.is_lstm:
            return output, (h.unsqueeze(0), c.unsqueeze(0))
        return output, h.unsqueeze(0)


def _gru_cell(gates: Tensor, recurrent: Tensor, h: Tensor) -> Tensor:
    """PyTorch's GRU update from input gates and recurrent gates (r, z, n order), (B, 3H)."""
    i_r, i_z, i_n = gates.chunk(3, dim=-1)
    h_r, h_z, h_n = recurrent.chunk(3, dim=-1)  # a fresh tensor: updated in place
    reset = h_r.add_(i_r).sigmoid_()
    update = h_z.add_(i_z).sigmoid_()
    new = i_n.add(h_n.mul_(reset)).tanh_()  # b_hn stays inside the reset, as in nn.GRU
    return (h - new).mul_(update).add_(new)  # (1 - z) n + z h


def _lstm_cell(gates: Tensor, recurrent: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """PyTorch's LSTM update from input and recurrent gates (i, f, g, o order), (B, 4H)."""
    i, f, g, o = recurrent.add_(gates).chunk(4, dim=-1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


# Folding stops here: the table is V x G floats, G / E times the embedding it replaces (26 MB
# for multi30k_best's 4,273 x 1,536; an LSTM of 1,024 over 32k pieces would need 512 MB).
MAX_TABLE_BYTES = 128 * 2**20


def can_fold(model: nn.Module) -> bool:
    """Whether :func:`fold_embeddings` changes ``model``: a Seq2Seq whose decoder is a
    single-layer float32 GRU/LSTM :class:`~seq2seq.models.decoders.LuongDecoder`, with a table
    of at most :data:`MAX_TABLE_BYTES`."""
    decoder = getattr(model, "decoder", None)
    rnn = getattr(decoder, "rnn", None)
    if not (isinstance(decoder, LuongDecoder) and type(rnn) in (nn.GRU, nn.LSTM)):
        return False
    table_bytes = decoder.embedding.num_embeddings * rnn.weight_ih_l0.size(0) * 4
    return (
        rnn.num_layers == 1
        and not rnn.bidirectional
        and rnn.batch_first
        and rnn.bias
        and rnn.weight_ih_l0.dtype == torch.float32  # the cell runs in float32
        and table_bytes <= MAX_TABLE_BYTES
    )


def _with_modules(module: nn.Module, **replaced: nn.Module) -> nn.Module:
    """A shallow copy of ``module``: the same parameters and submodules, except ``replaced``.
    The module itself is left as it is."""
    clone = copy.copy(module)
    clone._modules = {**module._modules, **replaced}
    return clone


@torch.no_grad()
def fold_embeddings(model: nn.Module) -> nn.Module:
    """``model`` with the decoder's embeddings folded into its RNN's input gates (see the
    module docstring), or ``model`` itself when :func:`can_fold` is False.

    The result shares every other parameter and submodule with ``model`` (nothing is copied
    but the two replaced decoder parts), so it holds a snapshot: fold again after training
    changes the weights.
    """
    if not can_fold(model):
        return model
    decoder = model.decoder
    rnn = decoder.rnn
    embed_dim = decoder.embed_dim
    w_ih = rnn.weight_ih_l0  # (G, E + R)
    table = decoder.embedding.weight @ w_ih[:, :embed_dim].T + rnn.bias_ih_l0  # (V, G)
    gates = nn.Embedding.from_pretrained(table, freeze=True)
    rest_proj = None
    if w_ih.size(1) > embed_dim:
        rest_proj = nn.Linear(w_ih.size(1) - embed_dim, w_ih.size(0), bias=False)
        rest_proj.weight.copy_(w_ih[:, embed_dim:])
    hidden_proj = nn.Linear(rnn.hidden_size, w_ih.size(0))
    hidden_proj.weight.copy_(rnn.weight_hh_l0)
    hidden_proj.bias.copy_(rnn.bias_hh_l0)
    rnn_type = "lstm" if isinstance(rnn, nn.LSTM) else "gru"
    folded_rnn = FoldedRNN(rnn_type=rnn_type, rest_proj=rest_proj, hidden_proj=hidden_proj)
    folded_rnn = folded_rnn.to(w_ih.device).train(decoder.training)
    gates.train(decoder.training)
    return _with_modules(model, decoder=_with_modules(decoder, embedding=gates, rnn=folded_rnn))


def fold_for_decoding(
    model: nn.Module, *, device: str | torch.device, autocast_dtype: torch.dtype | None
) -> nn.Module:
    """The model a float32 search on ``device`` decodes with: on the CPU, ``model`` (or each
    member of an :class:`~seq2seq.inference.ensemble.Ensemble`) folded where :func:`can_fold`;
    elsewhere, and under autocast (bf16/fp16, whose speed with the float32 cell is not
    measured), ``model`` itself."""
    if torch.device(device).type != "cpu" or autocast_dtype is not None:
        return model
    if isinstance(model, Ensemble):
        if not any(can_fold(member) for member in model.members):
            return model
        return Ensemble([fold_embeddings(member) for member in model.members])
    return fold_embeddings(model)
