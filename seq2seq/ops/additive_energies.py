"""The additive scorer's energies ``v^T tanh(q + k)`` in chunks: a speed and memory kernel.

:class:`~seq2seq.models.attention_scorers.AdditiveScorer` writes the formula at once, with its hidden
layer of one A-vector per (batch row, step, position): (B, T, S, A). :class:`AdditiveEnergies`
never holds it whole: forward builds it a few batch rows at a time and reduces each chunk to
its energies at once; backward keeps only the inputs and rebuilds each chunk. Chunks of a few
MB are reused from the allocator and stay in cache, where a fresh tensor of the whole layer
costs page faults and memory at every step. :class:`ChunkedAdditiveScorer` is the scorer's
``score`` through it, which :func:`seq2seq.ops.speed_up` installs.

The layer goes through ``tanh(x) = 2 sigmoid(2x) - 1``, so ``v^T tanh(x) = 2 (v^T sigmoid(2x) -
sum(v) / 2)``: CPUs compute sigmoid several times faster than tanh, and its derivative
``s (1 - s)`` is as cheap. The ``- sum(v) / 2`` is the bias of the product with v, added before
the result is rounded to the inputs' dtype: in bf16 it would cancel most of the product's digits
if subtracted after.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Elements of the (rows, T, S, A) hidden layer built at once.
CHUNK_ELEMENTS = 1 << 20


def _hidden(query: Tensor, keys: Tensor, rows: slice) -> Tensor:
    """sigmoid(2 (q + k)) for batch rows ``rows``: (rows, T, S, A)."""
    return torch.add(query[rows, :, None], keys[rows, None]).mul_(2).sigmoid_()


def _chunks(query: Tensor, keys: Tensor) -> list[slice]:
    per_row = query.size(1) * keys.size(1) * query.size(2)
    rows = max(1, CHUNK_ELEMENTS // max(per_row, 1))
    return [slice(i, i + rows) for i in range(0, query.size(0), rows)]


class AdditiveEnergies(torch.autograd.Function):
    """``e[b, t, s] = v . tanh(query[b, t] + keys[b, s])``, differentiable in all three.

    Shape:
        - query: (B, T, A), the projected queries
        - keys: (B, S, A), the projected keys (bias included)
        - v_weight: (1, A)
        - output: (B, T, S), in the dtype of query and keys together
    """

    @staticmethod
    def forward(ctx, query: Tensor, keys: Tensor, v_weight: Tensor) -> Tensor:
        ctx.input_dtypes = query.dtype, keys.dtype
        dtype = torch.promote_types(query.dtype, keys.dtype)
        query, keys, v = query.to(dtype), keys.to(dtype), v_weight.to(dtype)[0]  # v: (A,)
        # The bias -sum(v) / 2, summed in at least float32.
        half_sum = v.sum(dtype=torch.promote_types(dtype, torch.float32)).div(-2).to(dtype)
        energies = query.new_empty(query.size(0), query.size(1), keys.size(1))  # (B, T, S)
        for rows in _chunks(query, keys):
            hidden = _hidden(query, keys, rows)  # (rows, T, S, A)
            out = energies[rows].view(-1, 1)  # (rows * T * S, 1), a view into energies
            torch.addmm(half_sum.view(1), hidden.view(-1, hidden.size(-1)), v.unsqueeze(1), out=out)
        ctx.save_for_backward(query, keys, v_weight)
        return energies.mul_(2)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        query, keys, v_weight = ctx.saved_tensors
        v = v_weight.to(query.dtype)[0]  # (A,)
        grad = grad.to(query.dtype)
        grad_query, grad_keys = torch.empty_like(query), torch.empty_like(keys)
        grad_v = torch.zeros_like(v, dtype=torch.promote_types(v.dtype, torch.float32))
        for rows in _chunks(query, keys):
            hidden = _hidden(query, keys, rows)  # s = sigmoid(2x), (rows, T, S, A)
            chunk_grad = grad[rows]  # (rows, T, S)
            grad_v += chunk_grad.reshape(1, -1).mm(hidden.reshape(-1, hidden.size(-1)))[0]
            # d e / d x = 2 v * 2 s (1 - s), times the incoming gradient; the 4 comes below.
            hidden.addcmul_(hidden, hidden, value=-1).mul_(chunk_grad.unsqueeze(-1)).mul_(v)
            torch.sum(hidden, 2, out=grad_query[rows])
            torch.sum(hidden, 1, out=grad_keys[rows])
        grad_v = 2 * grad_v - grad.sum(dtype=grad_v.dtype)  # d/dv of 2 v.s - sum(v)
        query_dtype, keys_dtype = ctx.input_dtypes
        return (
            grad_query.mul_(4).to(query_dtype),
            grad_keys.mul_(4).to(keys_dtype),
            grad_v.view_as(v_weight).to(v_weight.dtype),
        )


def additive_energies(query: Tensor, keys: Tensor, v_weight: Tensor) -> Tensor:
    """:class:`AdditiveEnergies`, with autocast off inside: it computes in its inputs' dtype."""
    with torch.autocast(query.device.type, enabled=False):
        return AdditiveEnergies.apply(query, keys, v_weight)


class ChunkedAdditiveScorer:
    """Mixin over :class:`~seq2seq.models.attention_scorers.AdditiveScorer`: the same energies, same
    parameters, through :func:`additive_energies` (see :func:`seq2seq.ops.speed_up`)."""

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        q = self.query_proj(query)  # (B, T, A)
        return additive_energies(q, keys, self.v.weight)  # (B, T, S)
