"""The Transformer's fused attention in float32 on a CPU, under bf16 or fp16 autocast.

Autocast hands ``scaled_dot_product_attention`` half-precision queries, keys and values. At
the preset's shapes (about 95 sentences, 4 heads of 64, 17 positions) the CPU's fused kernel
then takes 4x as long for forward and backward as in float32 (21.0 against 5.5 ms on the
AVX512-BF16 EPYC, 2026-11-28; ``python -m benchmarks.profile_training
experiment=multi30k_transformer trainer.precision=bf16`` shows it as the largest row). The
attention does few FLOPs next to the projections around it, which stay in half precision.
"""

from __future__ import annotations

import torch
from torch import Tensor

HALF_PRECISIONS = (torch.bfloat16, torch.float16)


class Float32Attention:
    """Mixin over :class:`~seq2seq.models.transformer.MultiHeadAttention`: the same ``attend``,
    on a CPU run in float32 when its inputs are half precision, and cast back."""

    def attend(self, query: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None, *,
               causal: bool, dropout: float) -> Tensor:
        if query.device.type != "cpu" or query.dtype not in HALF_PRECISIONS:
            return super().attend(query, keys, values, mask, causal=causal, dropout=dropout)
        with torch.autocast("cpu", enabled=False):
            context = super().attend(query.float(), keys.float(), values.float(), mask,
                                     causal=causal, dropout=dropout)
        return context.to(query.dtype)
