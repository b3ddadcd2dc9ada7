"""The context half of a Luong decoder's ``combine`` layer, moved before the weighted sum.

A Luong decoder's attentional vector is ``a_t = tanh(W_c c_t + W_h h_t)`` (``combine`` split in
its context and state columns), with the context ``c_t = sum_s alpha_ts m_s``. Since
``W_c c_t = sum_s alpha_ts (W_c m_s)``, the memory can be projected once per sentence and the
weighted sum taken over the projected vectors: a search step then skips ``W_c c_t``, one
D x Dv product per decoder row. A beam search decodes about K target rows per source position
(K beams), so it computes the product on about K times fewer vectors: on ``multi30k_best``'s
test_2016, beam 5 does 4% fewer FLOP and runs 2–3% faster (README "Speed", item 15). Greedy
search decodes about one row per source position, so it would save nothing (1% more FLOP with
the padding positions, 2% slower): :class:`~seq2seq.inference.translator.Translator` decodes
greedy searches with the decoder's own modules
(:func:`~seq2seq.inference.folding.without_projected_context`).

:func:`project_context` gives the two replacement modules:

- :class:`ProjectedContextAttention` wraps the decoder's :class:`~seq2seq.models.attention.
  Attention`: its ``precompute_keys`` returns the scorer's keys and ``W_c m`` side by side
  along the last dimension, so whatever reorders, repeats or prunes the encoded source
  (searches, ensembles, shortlists) carries the projection along with the keys, and its
  ``forward`` returns ``W_c c_t`` in place of ``c_t``;
- :class:`StateCombine` takes ``[W_c c_t; h_t]`` (what the decoder's ``combine`` is then
  given) and returns ``W_c c_t + W_h h_t``.

Only the library's single-head scorers (:data:`PROJECTABLE_SCORERS`): a multi-head scorer
weights each head's slice of ``m_s`` on its own, so the projection would be needed once per head,
and a user-defined scorer may precompute keys of any shape (``(B, S, *)``), which the
projection cannot be joined to. Only float32 models, as the rest of the fold: a search under
bf16/fp16 autocast keeps the decoder as it is. The attention weights are unchanged; the features
equal the unprojected ones up to float rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from seq2seq.models.attention import Attention
from seq2seq.models.decoders import LuongDecoder
from seq2seq.models.scorers import (
    AdditiveScorer,
    DotScorer,
    GaussianScorer,
    GeneralScorer,
    LocationScorer,
    ScaledDotScorer,
)

# Scorers whose precomputed keys are one (B, S, Dk) tensor that ``score`` reads in place (a
# column slice of a wider tensor is fine): the projection is joined to them.
PROJECTABLE_SCORERS = (
    AdditiveScorer, DotScorer, ScaledDotScorer, GeneralScorer, GaussianScorer, LocationScorer)


class ProjectedContextAttention(nn.Module):
    """An :class:`~seq2seq.models.attention.Attention` whose context comes out projected:
    ``W_c c`` instead of ``c``.

    Args:
        attention: the decoder's attention (single-head scorer).
        context_proj: ``W_c`` (Dv -> D, no bias).

    Shape:
        - precompute_keys: memory (B, S, Dv) -> (B, S, Dk + D): the scorer's keys, then ``W_c m``
        - forward: as :class:`~seq2seq.models.attention.Attention`, with ``keys`` the output
          of :meth:`precompute_keys`; ``values`` is not read. Context (B, T, D), weights (B, T, S)
    """

    def __init__(self, *, attention: Attention, context_proj: nn.Module):
        super().__init__()
        self.attention = attention
        self.context_proj = context_proj

    @property
    def scorer(self) -> nn.Module:
        return self.attention.scorer

    @property
    def normalizer(self) -> str:
        return self.attention.normalizer

    def precompute_keys(self, keys: Tensor) -> Tensor:
        scorer_keys = self.attention.precompute_keys(keys)  # (B, S, Dk)
        return torch.cat([scorer_keys, self.context_proj(keys)], dim=-1)  # (B, S, Dk + D)

    def forward(self, query: Tensor, keys: Tensor, values: Tensor,
                mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        split = keys.size(-1) - self.context_proj.out_features  # Dk
        # Views, no copies: the scorer reads its columns, the weighted sum the projected ones.
        return self.attention(query, keys[..., :split], keys[..., split:], mask)


class StateCombine(nn.Module):
    """``combine`` for :class:`ProjectedContextAttention`: ``[W_c c; h] -> W_c c + W_h h``.

    Args:
        state_proj: ``W_h`` (H -> D, no bias), the state columns of ``combine``.
        combine: the decoder's own ``combine`` (shared, not called here), kept for
            :func:`~seq2seq.inference.folding.without_projected_context`.

    Shape:
        - input: (..., D + H)
        - output: (..., D)
    """

    def __init__(self, *, state_proj: nn.Module, combine: nn.Module):
        super().__init__()
        self.state_proj = state_proj
        self.combine = combine

    def forward(self, inputs: Tensor) -> Tensor:
        projected_context = inputs[..., : self.state_proj.out_features]  # (..., D)
        state = inputs[..., self.state_proj.out_features:]  # (..., H)
        return self.state_proj(state).add_(projected_context)


def can_project_context(decoder: nn.Module | None) -> bool:
    """Whether ``decoder`` is a float32 :class:`~seq2seq.models.decoders.LuongDecoder` whose
    attention is a plain :class:`~seq2seq.models.attention.Attention` around one of
    :data:`PROJECTABLE_SCORERS` and whose ``combine`` is a bias-free ``nn.Linear`` of ``[c; h]``."""
    # type(), not isinstance(): a subclass may compute something else with the same parts.
    if type(decoder) is not LuongDecoder:
        return False
    attention, combine = decoder.attention, decoder.combine
    return (
        type(attention) is Attention
        and type(attention.scorer) in PROJECTABLE_SCORERS
        and type(combine) is nn.Linear
        and combine.bias is None
        and combine.weight.dtype == torch.float32
        and combine.in_features > decoder.hidden_size
    )


@torch.no_grad()
def project_context(
    decoder: LuongDecoder, *, linear: Callable[[Tensor], nn.Module]
) -> dict[str, nn.Module]:
    """The ``attention`` and ``combine`` replacements of a Luong ``decoder`` (see the module
    docstring), each holding copies of its columns of ``combine``; ``linear(weight)`` makes an
    ``nn.Linear`` of a weight. The decoder's own modules are shared, not changed."""
    weight = decoder.combine.weight  # (D, Dv + H)
    context_size = weight.size(1) - decoder.hidden_size  # Dv
    context_proj = linear(weight[:, :context_size]).train(decoder.training)
    state_proj = linear(weight[:, context_size:]).train(decoder.training)
    attention = ProjectedContextAttention(attention=decoder.attention, context_proj=context_proj)
    combine = StateCombine(state_proj=state_proj, combine=decoder.combine)
    # Only the new modules' own flags: .train() would recurse into the shared ones.
    attention.training = combine.training = decoder.training
    return {"attention": attention, "combine": combine}
