"""Dropout on a CPU from 16 random bits an element: ``nn.Dropout``'s distribution, faster.

torch's CPU dropout draws its mask with ``bernoulli_``, one generator call per element, and
``torch.rand`` still makes one serial call per element. Here one 64-bit draw gives four
elements 16 bits each, and an element is dropped when its bits fall among the lowest
``round(p * 65536)`` of the 65,536 values: ``p`` rounded to 1/65,536 (at most 7.6e-6 off).
Kept elements are scaled by 1 / (1 - p), as in ``nn.Dropout``. A Transformer step runs 23 of
them; ``python -m benchmarks.bench_ops experiment=multi30k_transformer --kernels mask_dropout``
measures what the kernel buys (docs/speed.md). The draws differ from torch's, so a seeded run
repeats itself but not a run made without this kernel.
"""

from __future__ import annotations

import torch
from torch import Tensor

INT64 = torch.iinfo(torch.int64)
LEVELS = 1 << 16  # the values 16 bits take


def random_int16(shape: torch.Size, device: torch.device) -> Tensor:
    """Uniform int16s of ``shape``, four from each 64-bit draw of the default generator."""
    count = shape.numel()
    words = torch.empty((count + 3) // 4, dtype=torch.int64, device=device)
    words.random_(INT64.min, INT64.max)  # the full range: every 16-bit part is uniform
    return words.view(torch.int16)[:count].view(shape)


class MaskDropout:
    """Mixin over :class:`torch.nn.Dropout`: the same ``forward``, its mask from
    :func:`random_int16` on a CPU."""

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0 or x.device.type != "cpu":
            return super().forward(x)
        dropped_levels = round(self.p * LEVELS)
        if dropped_levels == LEVELS:
            return torch.zeros_like(x)
        keep = random_int16(x.shape, x.device) >= dropped_levels - LEVELS // 2  # int16 is signed
        if x.dtype == torch.float32:  # the scale folded into the mask: one product, same rounding
            return x * keep.to(x.dtype).mul_(1 / (1 - self.p))
        # a half-precision mask would round the scale: applied in float32 instead, as torch's
        return (x * keep.to(x.dtype)).mul_(1 / (1 - self.p))
