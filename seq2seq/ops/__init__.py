"""Speed kernels, and :func:`speed_up`, the one function that swaps them into a built model.

:mod:`seq2seq.models` writes each model as its paper does; the kernels here compute the same
functions faster or in less memory. Training and decoding call :func:`speed_up` on the model
they build; export never does, so an exported graph is the plain formula.

Each kernel is a mixin that overrides one method of a model class. :func:`speed_up` installs it
by changing a module's class to a subclass of its own class with the mixin in front: the
parameters, the state_dict keys, the config and the printed names stay those of the model.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from seq2seq.models.decoders import AttentionDecoder
from seq2seq.models.scorers import AdditiveScorer
from seq2seq.ops.additive_energies import ChunkedAdditiveScorer
from seq2seq.ops.contiguous_state import ContiguousState

# Each kernel by name: (the class it speeds up, its mixin, the methods the mixin computes anew).
# A subclass that overrides one of those methods keeps its own: the kernel would not compute it.
KERNELS: dict[str, tuple[type[nn.Module], type, tuple[str, ...]]] = {
    "additive_energies": (AdditiveScorer, ChunkedAdditiveScorer, ("score",)),
    "contiguous_state": (AttentionDecoder, ContiguousState, ()),  # wraps _rnn: any subclass
}

_swapped: dict[tuple[type, type], type] = {}


def _swapped_class(cls: type, mixin: type) -> type:
    """``cls`` with ``mixin`` in front, one class per pair (the same name, so logs and printed
    models read as before)."""
    if (cls, mixin) not in _swapped:
        names = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
        _swapped[cls, mixin] = type(cls.__name__, (mixin, cls), names)
    return _swapped[cls, mixin]


def speed_up(model: nn.Module, kernels: Iterable[str] = tuple(KERNELS)) -> nn.Module:
    """Swap the kernels into ``model`` in place (idempotent); returns ``model``.

    The outputs and gradients stay those of the plain model, to rounding. ``kernels`` names
    some of :data:`KERNELS` (benchmarks measure each alone); all by default.
    """
    kernels = list(kernels)
    unknown = sorted(set(kernels) - set(KERNELS))
    if unknown:
        raise ValueError(f"unknown kernels {unknown}; the kernels are {sorted(KERNELS)}")
    chosen = [KERNELS[name] for name in kernels]
    for module in model.modules():
        for base, mixin, computed in chosen:
            cls = type(module)
            if not isinstance(module, base) or isinstance(module, mixin):
                continue
            if any(getattr(cls, name) is not getattr(base, name) for name in computed):
                continue
            module.__class__ = _swapped_class(cls, mixin)
    return model
