"""A mixin put in front of the class of a built model's modules: the one way a model is made to
compute differently in place, used by the speed kernels (:func:`seq2seq.ops.speed_up`) and by
an int8 export's GRU steps (:func:`seq2seq.export.gru_products.gru_steps_as_products`).

:func:`mix_into` changes a module's class to a subclass of its own class with the mixin in
front, so the parameters, the state_dict keys, the config and the printed names stay those of
the model. It lives apart from both users because export may not import :mod:`seq2seq.ops`
(an exported graph is the plain formula; tests/test_layout.py).
"""

from __future__ import annotations

from torch import nn

# (class, mixin) -> the class with the mixin in front: one class per pair, so two models swapped
# alike have modules of one class.
_MIXED_CLASSES: dict[tuple[type, type], type] = {}


def mix_into(model: nn.Module, base: type[nn.Module], mixin: type,
             computes: tuple[str, ...] = ()) -> nn.Module:
    """Put ``mixin`` in front of the class of every module of ``model`` that is a ``base``, in
    place (idempotent); returns ``model``.

    ``computes``: the methods of ``base`` that the mixin computes anew. A subclass that
    overrides one of them keeps its class: the mixin would not compute what the subclass does.
    """
    for module in model.modules():
        cls = type(module)
        if not isinstance(module, base) or isinstance(module, mixin):
            continue
        if any(getattr(cls, name) is not getattr(base, name) for name in computes):
            continue
        if (cls, mixin) not in _MIXED_CLASSES:  # named as cls: logs and printouts read as before
            names = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
            _MIXED_CLASSES[cls, mixin] = type(cls.__name__, (mixin, cls), names)
        module.__class__ = _MIXED_CLASSES[cls, mixin]
    return model
