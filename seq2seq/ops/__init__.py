"""Speed kernels, and :func:`speed_up`, the one function that swaps them into a built model.

:mod:`seq2seq.models` writes each model as its paper does; the kernels here compute the same
functions faster or in less memory. Training and decoding call :func:`speed_up` on the model
they build; export never does, so an exported graph is the plain formula.

Each kernel is a mixin that overrides one method of a model class; :func:`speed_up` puts it in
front of the module's class with :func:`seq2seq.mixins.mix_into`.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from seq2seq.mixins import mix_into
from seq2seq.models.attention_scorers import AdditiveScorer
from seq2seq.models.decoders import AttentionDecoder
from seq2seq.models.transformer import MultiHeadAttention
from seq2seq.ops.additive_energies import ChunkedAdditiveScorer
from seq2seq.ops.contiguous_state import ContiguousState
from seq2seq.ops.cuda_attention import CudaAttention
from seq2seq.ops.float32_attention import Float32Attention
from seq2seq.ops.mask_dropout import MaskDropout

# Each kernel by name: (the class it speeds up, its mixin, the methods the mixin computes anew).
# A subclass that overrides one of those methods keeps its own: the kernel would not compute it.
KERNELS: dict[str, tuple[type[nn.Module], type, tuple[str, ...]]] = {
    "additive_energies": (AdditiveScorer, ChunkedAdditiveScorer, ("score",)),
    "contiguous_state": (AttentionDecoder, ContiguousState, ()),  # wraps _rnn: any subclass
    "float32_attention": (MultiHeadAttention, Float32Attention, ()),  # wraps attend
    "cuda_attention": (MultiHeadAttention, CudaAttention, ()),  # wraps attend
    "mask_dropout": (nn.Dropout, MaskDropout, ("forward",)),
}


def speed_up(model: nn.Module, kernels: Iterable[str] = tuple(KERNELS)) -> nn.Module:
    """Swap the kernels into ``model`` in place (idempotent); returns ``model``.

    The outputs and gradients stay those of the plain model, to rounding. ``kernels`` names
    some of :data:`KERNELS` (benchmarks measure each alone); all by default.
    """
    kernels = list(kernels)
    unknown = sorted(set(kernels) - set(KERNELS))
    if unknown:
        raise ValueError(f"unknown kernels {unknown}; the kernels are {sorted(KERNELS)}")
    for name in kernels:
        base, mixin, computed = KERNELS[name]
        mix_into(model, base, mixin, computed)
    return model
