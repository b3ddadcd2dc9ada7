"""The Transformer's fused attention on a CUDA GPU without cuDNN's backend.

``scaled_dot_product_attention`` may pick cuDNN's attention for the model's boolean key mask.
That backend builds an execution plan for each new shape of its inputs (a median of 179 ms a
call, up to 3 s, over 12 new shapes on an H200 against 0.88 ms for the memory-efficient kernel),
and length-bucketed batches bring a new (B, S, T) nearly every step; the memory-efficient
backend launches at once at any shape and takes the same mask.
``python -m benchmarks.probe_gpu_attention`` times the backends at repeated and new shapes.
PyTorch's backend switches are process-wide: threads that decode beside each other on one GPU
may see each other's choice, which changes the speed of a call, never its result.
"""

from __future__ import annotations

from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

# Flash attention takes no mask; math is the fallback any input runs on.
WITHOUT_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class CudaAttention:
    """Mixin over :class:`~seq2seq.models.transformer.MultiHeadAttention`: the same ``attend``,
    on a CUDA device among the backends that need no plan per shape."""

    def attend(self, query: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None, *,
               causal: bool, dropout: float) -> Tensor:
        if query.device.type != "cuda":
            return super().attend(query, keys, values, mask, causal=causal, dropout=dropout)
        with sdpa_kernel(WITHOUT_CUDNN):  # the backward runs the kernel the forward chose
            return super().attend(query, keys, values, mask, causal=causal, dropout=dropout)
