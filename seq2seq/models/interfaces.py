"""What every runtime of a model offers the searches and the Translator, typed once.

A *runtime* is anything that decodes: the PyTorch model (:class:`~seq2seq.models.seq2seq.Seq2Seq`),
an exported folder run by ONNX Runtime (:class:`~seq2seq.inference.onnx_model.OnnxModel`), an
:class:`~seq2seq.inference.ensemble.Ensemble` of either, a model seen through a shortlist. The
searches and the Translator call them through :class:`DecodingModel` only, never asking which
class they hold: what differs between runtimes is a capability each one declares here.

Read top to bottom, a translation is::

    encoded = model.encode(src, src_lengths)          # once per source batch
    state = model.init_state(encoded)
    logits, weights, state = model.decode_step(prev_tokens, state, encoded)   # per step

Shape:
    - src: (B, S) ids padded with PAD_ID; src_lengths: (B,) real lengths, on any device
    - encoded: :class:`Encoded`, B rows (a search repeats them per beam)
    - state: :data:`State`, every entry (N, ...) with dim 0 the decoder row
    - decode_step: prev_tokens (N,) -> logits (N, V) or (N, K) with ``output_ids`` (K,),
      attention weights (N, S), the new state
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch
from torch import Tensor

# A decoder state: named tensors whose dim 0 is the decoder row, so that a search can reorder
# or repeat any decoder's state with one ``index_select`` per entry.
State = dict[str, Tensor]

# The arithmetic a model may decode in (``DecodingModel.precisions``): the one list of them.
PRECISIONS = ("fp32", "bf16", "fp16")


def select_state(state: State, index: Tensor) -> State:
    """Reorder or repeat the rows of a decoder state (every entry is row-first)."""
    return {name: value.index_select(0, index) for name, value in state.items()}


class Encoded(Protocol):
    """A runtime's encoded source batch: whatever its ``decode_step`` reads, one row per
    sentence (or per beam once a search repeated them)."""

    def index_select(self, index: Tensor) -> Encoded:
        """Reorder or repeat rows (dim 0), e.g. to expand a batch into beams."""
        ...

    def cast_memory(self, dtype: torch.dtype) -> Encoded:
        """The same source with its float32 memory in ``dtype`` (the autocast dtype of a
        search), or itself where the runtime has nothing to cast."""
        ...


class EncodedSource(NamedTuple):
    """The PyTorch model's encoded source: the encoder's output plus the attention keys.

    Attributes:
        memory: encoder outputs, the attention values. Shape (B, S, D).
        mask: True at real source positions. Shape (B, S).
        final: the encoder's final state. Shape (B, D).
        keys: the decoder's precomputed keys (``precompute_keys(memory)``): ``W_k k`` for
            additive attention, every layer's cross-attention keys and values for the
            Transformer. Row first, then decoder-specific: (B, S, *) for most scorers.
    """

    memory: Tensor
    mask: Tensor
    final: Tensor
    keys: Tensor

    def index_select(self, index: Tensor) -> EncodedSource:
        return EncodedSource(*(t.index_select(0, index) for t in self))

    def cast_memory(self, dtype: torch.dtype) -> EncodedSource:
        """Autocast casts a float32 input of a matrix product at every call: in a search, the
        whole memory at every step. Cast once per batch, the products get the same values."""
        if self.memory.dtype != torch.float32 or dtype == torch.float32:
            return self
        memory = self.memory.to(dtype)
        keys = memory if self.keys is self.memory else self.keys  # keys that are the memory
        return self._replace(memory=memory, keys=keys)


def count_parameters(module, *, trainable: bool = False) -> int:
    """A module's parameters, a shared (tied) tensor counted once; ``trainable``: only those
    that train (``requires_grad``)."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable)


class DecodingModel(Protocol):
    """What the searches and the Translator call. Three methods are required; the rest are
    capabilities with the PyTorch model's answers as defaults, which a runtime subclassing this
    protocol inherits and overrides where it differs.

    Attributes:
        precisions: the precisions it can decode in (an exported graph: fp32 only).
        cpu_only: whether it runs on the CPU alone (ONNX Runtime's CPU provider).
        quantize: ``none``, or ``int8`` for weights exported in int8.
        training: whether it is in training mode (dropout on).
    """

    precisions: tuple[str, ...] = PRECISIONS
    cpu_only: bool = False
    quantize: str = "none"
    training: bool = False

    def encode(self, src: Tensor, src_lengths: Tensor) -> Encoded: ...

    def init_state(self, encoded: Encoded) -> State: ...

    def decode_step(self, prev_tokens: Tensor, state: State, encoded: Encoded, *,
                    output_ids: Tensor | None = None) -> tuple[Tensor, Tensor, State]:
        """One step: logits over the whole target vocabulary, or over ``output_ids`` only (a
        shortlist), the attention weights and the new state."""
        ...

    @property
    def parameter_count(self) -> int:
        """Parameters of the model, a tied tensor once."""
        return count_parameters(self)

    def attention_heads(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor) -> Tensor | None:
        """Every layer's and head's cross-attention over whole targets (teacher forcing), or
        None where the model has no heads to show.

        Shape:
            - tgt_in: (B, T) BOS then the target; output: (B, L, H, T, S)
        """
        return None

    def eval(self) -> DecodingModel:
        return self

    def train(self, mode: bool = True) -> DecodingModel:
        return self
