"""Embeddings folded into the RNNs' input gates, for decoding on the CPU.

A Luong decoder's RNN reads ``x_t = [e(y_{t-1}); a_{t-1}]`` (or ``e(y_{t-1})`` alone without
input feeding), so the first product of every step is
``W_ih x_t + b_ih = (W_e e(y_{t-1}) + b_ih) + W_a a_{t-1}``. The bracket depends on the previous
token only: it is one row of the table ``T = E W_e^T + b_ih`` (V, G), G = 3H for a GRU and 4H
for an LSTM (a :class:`GateTable`: each row computed the first time its token is looked up).
The encoder's first (and here only) layer is the same with nothing beside the embedding: each
direction's ``W_ih e(x) + b_ih`` is a row of its own table. :func:`fold_embeddings` returns a
shallow copy of the model in which

- the decoder's embedding is that table, so a step looks its gates up
  instead of multiplying ``W_e`` by an embedding: a quarter of the GRU's products in
  ``multi30k_best`` (E = 256 of the 768 inputs; 8% of a search's FLOP);
- the decoder's RNN is a :class:`FoldedRNN`: the folded gates plus ``W_a a_{t-1}`` and the
  recurrent product, then the GRU / LSTM cell, in float32;
- for the library's single-head scorers, the decoder's attention and ``combine`` are those of
  :mod:`seq2seq.inference.projected_context`: the memory is projected by combine's context
  half once per sentence, which beam search's steps then skip (greedy search gets the
  decoder's own back, :func:`without_projected_context`). That applies to any float32 Luong
  decoder, folded or not (deeper ones too);
- the encoder is a :class:`FoldedEncoder`: per direction, a table and a :class:`FoldedRNN` with
  the recurrent product only, for batches of :data:`MIN_FOLDED_BATCH` sentences or more. Half
  the encoder's products (the input ones) are gone: 7% of a greedy search's FLOP on
  ``multi30k_best``'s test set, 1.6% of beam 5's (net of computing the table rows).

Translations are the same up to float rounding (tested against the unfolded model); the model
passed in is left as it is, and the copy shares all its other parameters. Only single-layer
float32 GRU/LSTM encoders and Luong decoders are folded, each with tables of at most
:data:`MAX_TABLE_BYTES`, and each independently of the other: Bahdanau's decoder also feeds the
embedding itself to its output layer, and a deeper RNN would need the other layers unfolded
beside it. The tables fill row by row as tokens first come, so folding costs a one-sentence
translation next to nothing (all of ``multi30k_best``'s rows at once took 0.2 s on a 2-core
CPU).
:class:`~seq2seq.inference.translator.Translator` folds for float32 searches on the CPU,
before ``quantize=int8`` (which then quantizes the products of every :class:`FoldedRNN`; the
tables stay float like every embedding). On a GPU the cuDNN RNNs are kept, and bf16/fp16
searches keep the model as it is: the folded cell runs in float32, and that path was not timed
on a CPU with bf16 instructions.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from seq2seq.inference.ensemble import Ensemble
from seq2seq.inference.projected_context import (
    ProjectedContextAttention,
    can_project_context,
    project_context,
)
from seq2seq.models.decoders import LuongDecoder
from seq2seq.models.encoder import (
    EncoderOutput,
    RNNEncoder,
    final_states,
    gather_rows,
    reversal_index,
    source_mask,
)


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


class GateTable(nn.Module):
    """The folded gates ``E W^T + b`` (V, G) of an embedding ``E`` (V, E) and an input product
    ``W`` (G, E), ``b`` (G), looked up by token id. Each row is computed the first time its id
    is looked up: a model folded to translate one sentence multiplies a few rows, not the
    whole vocabulary (0.2 s for all of ``multi30k_best``'s tables on a 2-core CPU), and a test
    set only the pieces it uses. The rows are allocated at the first lookup, so a copy made
    before it (``quantize=int8``'s) copies none.

    Holds copies of ``E``, ``W`` and ``b``: later changes to the model's weights do not reach
    it. Filling rows changes the module, so one thread at a time may use it (as the server's
    one worker thread per model does).

    Shape:
        - ids: (...) token ids
        - output: (..., G), in the dtype of ``W``
    """

    rows: Tensor | None

    def __init__(self, *, embedding: Tensor, weight: Tensor, bias: Tensor):
        super().__init__()
        # Plain tensors even when folded inside inference_mode: rows are filled by searches
        # (which run in it) and by forward passes outside it.
        with torch.inference_mode(False):
            for name, value in (("embedding", embedding), ("weight", weight), ("bias", bias)):
                self.register_buffer(name, value.detach().clone(), persistent=False)
            known = torch.zeros(embedding.size(0), dtype=torch.bool, device=embedding.device)
            self.register_buffer("known", known, persistent=False)
            self.register_buffer("rows", None, persistent=False)

    def forward(self, ids: Tensor) -> Tensor:
        if self.rows is None:
            with torch.inference_mode(False):  # untouched pages of it stay unmapped
                self.rows = self.weight.new_empty(self.embedding.size(0), self.weight.size(0))
        new = ids[~self.known[ids]]
        if new.numel():
            new = new.unique()
            # Rows in W's dtype under autocast too: they are kept for every later search.
            with torch.no_grad(), torch.autocast(self.rows.device.type, enabled=False):
                self.rows[new] = torch.addmm(self.bias, self.embedding[new], self.weight.T)
                self.known[new] = True
        return nn.functional.embedding(ids, self.rows)


# Below this many sentences a batch is encoded by the unfolded encoder: a FoldedEncoder's
# Python loop costs about 65 us more per source position and direction than nn.GRU's, and the
# input products it saves are worth less than that for small batches. On the 2-core AVX2 EPYC
# (one direction of multi30k_best's encoder over 16 positions): 1 sentence 3.2 ms unfolded
# against 4.9 ms folded, 8: 8.9 against 9.0, 16: 12.6 against 11.6, 64: 38.0 against 26.7.
MIN_FOLDED_BATCH = 16


class FoldedEncoder(nn.Module):
    """A one-layer :class:`~seq2seq.models.encoder.RNNEncoder` whose embeddings are folded
    into each direction's input gates: a direction looks its ``W_ih e(x) + b_ih`` up, then runs
    its :class:`FoldedRNN` over the padded batch (the backward one over every row reversed
    within its length, as the encoder does on the CPU). For decoding: no dropout. Batches of
    fewer than :data:`MIN_FOLDED_BATCH` sentences go to ``unfolded``.

    Args:
        gates: per direction, the table ``E W_ih^T + b_ih`` (V, G).
        rnns: per direction, a :class:`FoldedRNN` without a rest (R = 0).
        hidden_size: H, the state size of one direction.
        unfolded: the encoder folded (shared, not copied), for small batches.

    Shape:
        - src: (B, S) token ids; src_lengths: (B,) real lengths
        - output: :class:`~seq2seq.models.encoder.EncoderOutput`, as the encoder's
    """

    def __init__(self, *, gates: list[GateTable], rnns: list[FoldedRNN], hidden_size: int,
                 unfolded: RNNEncoder):
        super().__init__()
        self.unfolded = unfolded
        self.gates = nn.ModuleList(gates)
        self.rnns = nn.ModuleList(rnns)
        self.hidden_size = hidden_size
        self.num_directions = len(rnns)
        self.output_size = hidden_size * self.num_directions

    def forward(self, src: Tensor, src_lengths: Tensor) -> EncoderOutput:
        batch_size, src_len = src.shape
        if batch_size < MIN_FOLDED_BATCH:
            return self.unfolded(src, src_lengths)
        lengths = src_lengths.to(src.device)
        mask = source_mask(lengths, src_len)  # (B, S)
        reverse = reversal_index(lengths, src_len)  # (B, S)
        outputs = []
        for direction, (gates, rnn) in enumerate(zip(self.gates, self.rnns, strict=True)):
            ids = src.gather(1, reverse) if direction else src  # (B, S)
            zeros = torch.zeros(1, batch_size, self.hidden_size, device=src.device)
            output, _ = rnn(gates(ids), (zeros, zeros) if rnn.is_lstm else zeros)  # (B, S, H)
            outputs.append(gather_rows(output, reverse) if direction else output)
        output = torch.cat(outputs, dim=-1)  # (B, S, D)
        return EncoderOutput(
            memory=output * mask.unsqueeze(-1),  # zeros at padding
            mask=mask,
            final=final_states(output, lengths, self.num_directions),
        )


# Folding stops here: a table is V x G floats, G / E times the embedding it replaces (26 MB
# for multi30k_best's decoder, 4,273 x 1,536; an LSTM of 1,024 over 32k pieces would need
# 512 MB). An encoder's tables (one per direction) count together.
MAX_TABLE_BYTES = 128 * 2**20


def _is_plain_rnn(rnn: nn.Module | None) -> bool:
    """A one-layer, batch-first float32 ``nn.GRU`` / ``nn.LSTM`` with biases."""
    return (
        type(rnn) in (nn.GRU, nn.LSTM)
        and rnn.num_layers == 1
        and rnn.batch_first
        and rnn.bias
        and rnn.weight_ih_l0.dtype == torch.float32  # the cell runs in float32
    )


def can_fold_decoder(decoder: nn.Module | None) -> bool:
    """Whether ``decoder`` is a single-layer float32 GRU/LSTM
    :class:`~seq2seq.models.decoders.LuongDecoder` with a table of at most
    :data:`MAX_TABLE_BYTES`."""
    rnn = getattr(decoder, "rnn", None)
    # type(), not isinstance(): a subclass may compute something else with the same parts.
    if not (type(decoder) is LuongDecoder and _is_plain_rnn(rnn)) or rnn.bidirectional:
        return False
    return decoder.embedding.num_embeddings * rnn.weight_ih_l0.size(0) * 4 <= MAX_TABLE_BYTES


def can_fold_encoder(encoder: nn.Module | None) -> bool:
    """Whether ``encoder`` is a single-layer float32 GRU/LSTM
    :class:`~seq2seq.models.encoder.RNNEncoder` with tables of at most
    :data:`MAX_TABLE_BYTES` together."""
    rnn = getattr(encoder, "rnn", None)
    if not (type(encoder) is RNNEncoder and _is_plain_rnn(rnn)):
        return False
    directions = 2 if rnn.bidirectional else 1
    table_bytes = encoder.embedding.num_embeddings * rnn.weight_ih_l0.size(0) * 4 * directions
    return table_bytes <= MAX_TABLE_BYTES


def can_fold(model: nn.Module) -> bool:
    """Whether :func:`fold_embeddings` changes ``model``: a Seq2Seq whose encoder or decoder
    can be folded (:func:`can_fold_encoder`, :func:`can_fold_decoder`) or whose decoder's
    context can be projected (:func:`~seq2seq.inference.projected_context.can_project_context`)."""
    decoder = getattr(model, "decoder", None)
    return (can_fold_encoder(getattr(model, "encoder", None)) or can_fold_decoder(decoder)
            or can_project_context(decoder))


def _with_modules(module: nn.Module, **replaced: nn.Module) -> nn.Module:
    """A shallow copy of ``module``: the same parameters and submodules, except ``replaced``.
    The module itself is left as it is."""
    clone = copy.copy(module)
    clone._modules = {**module._modules, **replaced}
    return clone


def _linear(weight: Tensor, bias: Tensor | None = None) -> nn.Linear:
    """An ``nn.Linear`` holding copies of ``weight`` (out, in) and ``bias``."""
    linear = nn.Linear(weight.size(1), weight.size(0), bias=bias is not None,
                       device=weight.device, dtype=weight.dtype)
    linear.weight.copy_(weight)
    if bias is not None:
        linear.bias.copy_(bias)
    return linear


def _fold_decoder(decoder: LuongDecoder) -> nn.Module:
    """A shallow copy of ``decoder`` with its embedding folded into its RNN where
    :func:`can_fold_decoder`, and combine's context half projected onto the memory where
    :func:`~seq2seq.inference.projected_context.can_project_context`."""
    replaced = {}
    if can_fold_decoder(decoder):
        rnn = decoder.rnn
        embed_dim = decoder.embed_dim
        w_ih = rnn.weight_ih_l0  # (G, E + R)
        gates = GateTable(
            embedding=decoder.embedding.weight, weight=w_ih[:, :embed_dim], bias=rnn.bias_ih_l0)
        rest_proj = _linear(w_ih[:, embed_dim:]) if w_ih.size(1) > embed_dim else None
        folded_rnn = FoldedRNN(
            rnn_type="lstm" if isinstance(rnn, nn.LSTM) else "gru",
            rest_proj=rest_proj,
            hidden_proj=_linear(rnn.weight_hh_l0, rnn.bias_hh_l0),
        )
        gates.train(decoder.training)
        folded_rnn.train(decoder.training)
        replaced.update(embedding=gates, rnn=folded_rnn)
    if can_project_context(decoder):
        replaced.update(project_context(decoder, linear=_linear))
    return _with_modules(decoder, **replaced)


def _fold_encoder(encoder: RNNEncoder) -> FoldedEncoder:
    rnn = encoder.rnn
    suffixes = ["", "_reverse"] if rnn.bidirectional else [""]
    rnn_type = "lstm" if isinstance(rnn, nn.LSTM) else "gru"
    gates = [
        GateTable(embedding=encoder.embedding.weight, weight=getattr(rnn, f"weight_ih_l0{suffix}"),
                  bias=getattr(rnn, f"bias_ih_l0{suffix}"))
        for suffix in suffixes
    ]
    rnns = [
        FoldedRNN(rnn_type=rnn_type, rest_proj=None, hidden_proj=_linear(
            getattr(rnn, f"weight_hh_l0{suffix}"), getattr(rnn, f"bias_hh_l0{suffix}")))
        for suffix in suffixes
    ]
    folded = FoldedEncoder(gates=gates, rnns=rnns, hidden_size=rnn.hidden_size, unfolded=encoder)
    return folded.train(encoder.training)


@torch.no_grad()
def fold_embeddings(model: nn.Module) -> nn.Module:
    """``model`` with the encoder's and the decoder's embeddings folded into their RNNs' input
    gates where each can be, and the decoder's context projected for beam search where it can
    be (see the module docstring), or ``model`` itself when :func:`can_fold` is False.

    The result shares every other parameter and submodule with ``model`` (nothing is copied
    but the replaced parts and the tables' sources): fold again after training changes the
    weights.
    """
    replaced = {}
    if can_fold_encoder(getattr(model, "encoder", None)):
        replaced["encoder"] = _fold_encoder(model.encoder)
    decoder = getattr(model, "decoder", None)
    if can_fold_decoder(decoder) or can_project_context(decoder):
        replaced["decoder"] = _fold_decoder(decoder)
    return _with_modules(model, **replaced) if replaced else model


def without_projected_context(model: nn.Module) -> nn.Module:
    """``model`` (or each member of an :class:`~seq2seq.inference.ensemble.Ensemble`) with its
    decoder's own attention and ``combine`` back where :func:`fold_embeddings` projected the
    context (:mod:`seq2seq.inference.projected_context`), for greedy search: it decodes about
    one target step per source position, so projecting the memory saves nothing there (greedy
    on test_2016 with ``multi30k_best``: 1% more FLOP, 2% slower). A shallow copy, made in
    microseconds; ``model`` itself when nothing was projected."""
    if isinstance(model, Ensemble):
        members = [without_projected_context(member) for member in model.members]
        if all(new is old for new, old in zip(members, model.members, strict=True)):
            return model
        return Ensemble(members)
    decoder = getattr(model, "decoder", None)
    attention = getattr(decoder, "attention", None)
    if not isinstance(attention, ProjectedContextAttention):
        return model
    decoder = _with_modules(
        decoder, attention=attention.attention, combine=decoder.combine.combine)
    return _with_modules(model, decoder=decoder)


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
