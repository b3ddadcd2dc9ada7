"""The attention decoders' state kept contiguous after each RNN step: a kernel for bf16 on CPUs.

The RNN hands its state back layer-first (L, B, H); the decoders store it batch-first
(B, L, H), which is a transposed view. With several layers, a Bahdanau query sliced from that
view, ``state["hidden"][:, -1:]``, has strides that make bf16 matrix products on CPUs (oneDNN)
broadcast their weight per sentence. One copy of the state per step avoids it.
"""

from __future__ import annotations

from torch import Tensor

from seq2seq.models.interfaces import State


class ContiguousState:
    """Mixin over :class:`~seq2seq.models.decoders.AttentionDecoder`: the same ``_rnn``, its
    new state copied contiguous (see :func:`seq2seq.ops.speed_up`)."""

    def _rnn(self, inputs: Tensor, state: State) -> tuple[Tensor, State]:
        output, new_state = super()._rnn(inputs, state)  # output (B, T, H)
        return output, {name: value.contiguous() for name, value in new_state.items()}
