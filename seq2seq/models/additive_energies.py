"""Additive attention energies ``v^T tanh(q + k)`` for every (step, position) pair, in chunks.

The additive scorer's hidden layer has one A-vector per (batch row, step, position): (B, T, S,
A), 8 M values (32 MB in fp32) for a Multi30k training batch. Built as one tensor through
autograd it costs more than its arithmetic: fresh buffers that size come from the OS with page
faults at every step, autograd keeps it for backward, and the CPU's ``tanh`` is slow.
:class:`AdditiveEnergies` instead

- builds the layer a few batch rows at a time (``CHUNK_ELEMENTS``, a few MB, reused from the
  allocator's free lists and warm in cache), reducing each chunk to its energies at once;
- keeps only the inputs for backward and rebuilds each chunk there;
- uses ``tanh(x) = 2 sigmoid(2x) - 1``, so ``v^T tanh(x) = 2 (v^T sigmoid(2x) - sum(v) / 2)``:
  PyTorch's CPU sigmoid is about 6x faster than its tanh (5 against 32 ms on 15 M fp32 values,
  AVX512) and its derivative ``s (1 - s)`` needs no more. The ``- sum(v) / 2`` is the bias of
  the product with v (one ``addmm``), so it is taken off before the result is rounded to the
  inputs' dtype: subtracted after, in bf16 with ``sum(v)`` = 100, it put attention weights off
  by up to 0.09 (0.01 as a bias, as good as tanh at once; tested). The bias's own rounding
  shifts every energy alike, which the softmax ignores. In bf16 the ``addmm`` is also faster
  than a matrix-vector product (1.8 against 3.0 ms for 17,920 rows of 512, 2-core AMD EPYC);
  in fp32 it was slower (beam 5 -10%) and not needed, so fp32 subtracts after the product.

It computes in the inputs' dtype. The scorer uses it for every search and every training step
except under autocast for a single decoder step (input feeding), whose small (B, 1, S, A)
layer built at once was 8% faster than rebuilding it in backward, and on GPUs (not measured
there). For all target steps at once under bf16 on the CPU the chunks cost 1% of a step and
take the 0.17 GiB layer and its gradients out of the peak memory (README "Speed", item 8).
"""

from __future__ import annotations

import torch
from torch import Tensor

# Elements of the (rows, T, S, A) hidden layer built at once.
CHUNK_ELEMENTS = 1 << 20


def _hidden(query: Tensor, keys: Tensor, rows: slice) -> Tensor:
    """sigmoid(2 (q + k)) for batch rows ``rows``: (rows, T, S, A), in their common dtype."""
    return torch.add(query[rows, :, None], keys[rows, None]).mul_(2).sigmoid_()


def _dtype(query: Tensor, keys: Tensor) -> torch.dtype:
    return torch.promote_types(query.dtype, keys.dtype)


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
        v = v_weight.to(_dtype(query, keys))[0]  # (A,)
        wide = torch.promote_types(v.dtype, torch.float32)
        half_sum = v.sum(dtype=wide).div(-2).to(v.dtype).view(1)  # the bias -sum(v) / 2
        energies = query.new_empty(query.size(0), query.size(1), keys.size(1), dtype=v.dtype)
        as_bias = v.dtype in (torch.bfloat16, torch.float16)
        for rows in _chunks(query, keys):
            hidden = _hidden(query, keys, rows)  # (rows, T, S, A)
            if as_bias:
                out = energies[rows].view(-1, 1)  # (rows * T * S, 1), a view into energies
                torch.addmm(half_sum, hidden.view(-1, hidden.size(-1)), v.unsqueeze(1), out=out)
            else:
                torch.matmul(hidden, v, out=energies[rows])
        ctx.save_for_backward(query, keys, v_weight)
        if not as_bias:
            energies.add_(half_sum)
        return energies.mul_(2)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        query, keys, v_weight = ctx.saved_tensors
        v = v_weight.to(_dtype(query, keys))[0]
        grad = grad.to(v.dtype)
        grad_query = query.new_empty(query.shape, dtype=v.dtype)
        grad_keys = keys.new_empty(keys.shape, dtype=v.dtype)
        grad_v = v.new_zeros(v.shape, dtype=torch.promote_types(v.dtype, torch.float32))
        for rows in _chunks(query, keys):
            hidden = _hidden(query, keys, rows)  # s = sigmoid(2x), (rows, T, S, A)
            chunk_grad = grad[rows]  # (rows, T, S)
            grad_v += chunk_grad.reshape(1, -1).mm(hidden.reshape(-1, hidden.size(-1)))[0]
            # d e / d x = 2 v * 2 s (1 - s): the factor 4 is applied once below.
            hidden.addcmul_(hidden, hidden, value=-1).mul_(chunk_grad.unsqueeze(-1)).mul_(v)
            torch.sum(hidden, 2, out=grad_query[rows])
            torch.sum(hidden, 1, out=grad_keys[rows])
        grad_v = 2 * grad_v - grad.sum(dtype=grad_v.dtype)  # d/dv of 2 v.s - sum(v)
        return (
            grad_query.mul_(4).to(query.dtype),
            grad_keys.mul_(4).to(keys.dtype),
            grad_v.view_as(v_weight).to(v_weight.dtype),
        )


def additive_energies(query: Tensor, keys: Tensor, v_weight: Tensor) -> Tensor:
    """:class:`AdditiveEnergies`, with autocast off inside: it computes in its inputs' dtype."""
    with torch.autocast(query.device.type, enabled=False):
        return AdditiveEnergies.apply(query, keys, v_weight)
