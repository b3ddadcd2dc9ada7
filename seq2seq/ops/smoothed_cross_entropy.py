"""Label-smoothed cross-entropy over the output layer's logits, a few rows at a time.

The formula, for the logits x of one target token y over V pieces and smoothing eps::

    lse  = log sum_v exp(x_v)
    nll  = lse - x_y                                   # -log p_y
    loss = (1 - eps) * nll + eps * (lse - mean_v x_v)  # eps * mean_v(-log p_v) for the second
    d loss / d x_v = softmax(x)_v - (1 - eps) [v = y] - eps / V

Written with autograd (``log_softmax``, ``gather``, ``mean``) it makes a dozen passes over the
(N, V) logits, forward and backward, each into a fresh tensor of N x V floats (27 MB for a
Multi30k batch of 1,600 tokens and 4,288 pieces), and under bf16 autocast casts the whole
matrix to float32 first. Here forward keeps only lse and the row means, computed in float32 a
block of rows at a time (a block stays in the core's cache), and backward rebuilds each block's
softmax from the logits and writes its gradient once, in the logits' dtype. ``python -m
benchmarks.bench_ops experiment=multi30k_transformer --kernels --plain-loss`` measures what it
pays against the formula (docs/speed.md).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

# Float32 elements of one block of rows on a CPU (1 MiB: a Zen 4 core's L2). A GPU takes the
# whole matrix as one block: there each block costs kernel launches, not cache misses.
BLOCK_ELEMENTS = 1 << 18


def _blocks(logits: Tensor) -> list[slice]:
    rows, width = logits.shape
    step = max(1, BLOCK_ELEMENTS // max(width, 1)) if logits.device.type == "cpu" else rows
    return [slice(start, start + step) for start in range(0, rows, max(step, 1))]


class SmoothedCrossEntropy(torch.autograd.Function):
    """(loss, nll) per row of ``logits``, differentiable in the logits through ``loss`` only.

    Shape:
        - logits: (N, V), any float dtype; targets: (N,) piece ids
        - output: loss (N,) and nll (N,), float32
    """

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, smoothing: float) -> tuple[Tensor, Tensor]:
        rows = logits.size(0)
        lse = logits.new_empty(rows, dtype=torch.float32)
        means = logits.new_empty(rows, dtype=torch.float32)
        for block in _blocks(logits):
            x = logits[block].to(torch.float32, copy=True)  # (n, V), changed in place below
            torch.mean(x, dim=-1, out=means[block])
            top = x.amax(dim=-1, keepdim=True)  # (n, 1)
            lse[block] = x.sub_(top).exp_().sum(dim=-1).log_().add_(top.squeeze(1))
        nll = lse - logits.gather(1, targets.unsqueeze(1)).squeeze(1).float()  # (N,)
        loss = (1 - smoothing) * nll + smoothing * (lse - means) if smoothing else nll.clone()
        ctx.save_for_backward(logits, targets, lse)
        ctx.smoothing = smoothing
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    @once_differentiable  # its gradient is not differentiable again (no double backward)
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor, None, None]:
        logits, targets, lse = ctx.saved_tensors
        smoothing, width = ctx.smoothing, logits.size(1)
        grad = torch.empty_like(logits)  # (N, V), in the logits' dtype
        for block in _blocks(logits):
            scale = grad_loss[block].unsqueeze(1)  # (n, 1)
            x = logits[block].to(torch.float32, copy=True).sub_(lse[block].unsqueeze(1)).exp_().mul_(scale)  # p * g
            if smoothing:
                x.sub_(scale * (smoothing / width))
            x.scatter_add_(1, targets[block].unsqueeze(1), scale * -(1 - smoothing))
            grad[block] = x
        return grad, None, None


def smoothed_cross_entropy(logits: Tensor, targets: Tensor, smoothing: float = 0.0
                           ) -> tuple[Tensor, Tensor]:
    """Per row of ``logits`` (N, V): the label-smoothed loss, which carries the gradient, and
    the NLL ``-log p_y`` (for perplexity), both float32 (N,). See the module's formula."""
    with torch.autocast(logits.device.type, enabled=False):
        return SmoothedCrossEntropy.apply(logits, targets, float(smoothing))
