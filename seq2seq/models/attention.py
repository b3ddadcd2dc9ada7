"""Attention: pluggable scorers plus the one module that turns their energies into a context.

A *scorer* only computes energies e[b, t, s]: how well decoder step t of sentence b matches
source position s. Everything else (padding mask, normalization by softmax or sparsemax,
weighted sum of the values) lives in :class:`Attention`, so a new scorer never has to get
masking or numerics right. The library's scorers live in :mod:`seq2seq.models.attention_scorers`; configs
name them by registry name (``additive``, :mod:`seq2seq.models.registry`). They are also
importable from here, as code written against earlier versions imports them.

The scorer contract:

- the constructor is keyword-only and accepts ``query_dim`` and ``key_dim`` (passed by the model
  builder) plus the scorer's own options;
- ``precompute_keys(keys)`` maps keys (B, S, Dk) to whatever ``score`` wants to reuse at every
  decoder step (e.g. a key projection), computed once per source batch. It is returned to the
  caller, never stored on the module, so one module can serve any number of batches. It must
  keep the batch as dim 0: beam search reorders and repeats it with ``index_select(0, ...)``;
- ``score(query, keys)`` maps a query (B, T, Dq) and the precomputed keys to energies (B, T, S),
  or (B, T, H, S) for a multi-head scorer. T = 1 when decoding step by step, T = the whole
  target in the parallel (teacher-forced) training path;
- ``num_heads``: 1 for single-head scorers.

A user-defined scorer takes a few lines (docs/models.md#writing-your-own-scorer has one,
e = scale * cos(q, W k)); plug it in with ``model.attention._target_=my_module.CosineScorer``.
"""

import torch
from torch import Tensor, nn

from seq2seq.models.attention_scorers import (
    AdditiveScorer,
    DotScorer,
    GaussianScorer,
    GeneralScorer,
    LocationScorer,
    MultiHeadScorer,
    ScaledDotScorer,
    Scorer,
)

__all__ = [
    "AdditiveScorer",
    "Attention",
    "DotScorer",
    "GaussianScorer",
    "GeneralScorer",
    "LocationScorer",
    "MultiHeadScorer",
    "NORMALIZERS",
    "ScaledDotScorer",
    "Scorer",
    "sparsemax",
]


def sparsemax(energies: Tensor, dim: int = -1) -> Tensor:
    """Sparsemax (Martins & Astudillo, 2016): the Euclidean projection onto the simplex.

    p = max(z - tau, 0) with tau = (sum_{j <= k} z_(j) - 1) / k, z_(1) >= z_(2) >= ... sorted,
    and k the largest index with 1 + k z_(k) > sum_{j <= k} z_(j). Rows sum to 1 and, unlike
    softmax, low energies get exactly zero weight. -inf entries (padding) are allowed and get
    exactly zero; every row needs at least one finite entry. The gradient is autograd's through
    this closed form (diag(s) - s s^T / |s| on the support s), exact away from ties.

    Shape:
        - energies: (*, S, *), any shape; normalized along ``dim``
        - output: same shape
    """
    z = energies - energies.amax(dim=dim, keepdim=True)  # shift-invariant; max is 0, finite
    z_sorted = torch.sort(z, dim=dim, descending=True).values
    finite = torch.isfinite(z_sorted)
    z_sorted = z_sorted.masked_fill(~finite, 0.0)  # -inf sort last; keep them out of the sums
    cumsum = z_sorted.cumsum(dim)
    shape = [1] * z.dim()
    shape[dim] = z.size(dim)
    k = torch.arange(1, z.size(dim) + 1, device=z.device, dtype=z.dtype).view(shape)
    support = finite & (1 + k * z_sorted > cumsum)  # a prefix of the sorted entries, >= 1 long
    k_max = support.sum(dim=dim, keepdim=True)
    tau = (cumsum.gather(dim, k_max - 1) - 1) / k_max.to(z.dtype)
    return torch.clamp(z - tau, min=0)  # -inf - tau = -inf -> exactly 0


NORMALIZERS = {"softmax": torch.softmax, "sparsemax": sparsemax}


class Attention(nn.Module):
    """Masked attention around a scorer: energies -> weights -> context.

    This module alone applies the padding mask, the normalization over source positions
    (softmax, or sparsemax: a projection onto the simplex that gives low energies exactly zero
    weight) and the weighted sum of the values, for any scorer. Padding gets exactly zero weight
    under both normalizers. With a multi-head scorer (4-D energies), head h
    attends over the h-th of H equal slices of every value vector; the per-head contexts are
    concatenated back to Dv and the returned weights are averaged over the heads.

    Args:
        scorer: A scorer following the contract in this module's docstring.
        normalizer: ``"softmax"`` or ``"sparsemax"`` (a key of :data:`NORMALIZERS`).

    Raises:
        ValueError: If ``normalizer`` is unknown.

    Shape:
        - query: (B, T, Dq)
        - keys: the output of :meth:`precompute_keys`
        - values: (B, S, Dv)
        - mask: (B, S), bool, True at real tokens
        - context: (B, T, Dv)
        - weights: (B, T, S)
    """

    def __init__(self, scorer: nn.Module, normalizer: str = "softmax"):
        super().__init__()
        if normalizer not in NORMALIZERS:
            raise ValueError(
                f"model.attention.normalizer must be one of {', '.join(NORMALIZERS)}, "
                f"got {normalizer!r}"
            )
        self.scorer = scorer
        self.normalizer = normalizer

    def precompute_keys(self, keys: Tensor) -> Tensor:
        """Run the scorer's once-per-batch key work; pass the result to every :meth:`forward`."""
        return self.scorer.precompute_keys(keys)

    def normalize(self, energies: Tensor) -> Tensor:
        """Weights from energies over the last dim (-inf at padding): softmax or sparsemax."""
        return NORMALIZERS[self.normalizer](energies, dim=-1)

    def forward(
        self, query: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Attend from T query steps over S source positions (shapes: see the class docstring).

        ``values`` are usually the encoder outputs. ``mask=None`` means no padding; otherwise
        every row needs at least one real token. Returns the context vectors and the attention
        weights (exactly 0 at padding).
        """
        energies = self.scorer.score(query, keys)  # (B, T, S) or (B, T, H, S)
        multi_head = energies.dim() == 4
        # Normalize in at least float32: in bf16/fp16 (autocast) the exp (softmax), the sums and
        # the threshold (sparsemax) lose too much precision. float64 stays float64.
        energies = energies.to(torch.promote_types(energies.dtype, torch.float32))
        if mask is not None:
            # -inf gives exactly zero weight: exp(-inf) = 0 in softmax, max(-inf - tau, 0) = 0
            # in sparsemax.
            pad = ~mask[:, None, None, :] if multi_head else ~mask[:, None, :]  # broadcast
            energies = energies.masked_fill(pad, float("-inf"))
        weights = self.normalize(energies).to(values.dtype)  # (B, T, [H,] S)
        if not multi_head:
            return torch.bmm(weights, values), weights  # (B, T, Dv), (B, T, S)

        B, T, H, S = weights.shape
        Dv = values.size(-1)
        if Dv % H != 0:
            raise ValueError(f"values of size {Dv} cannot be split into {H} equal heads.")
        v = values.reshape(B, S, H, Dv // H).transpose(1, 2)  # (B, H, S, Dv/H)
        context = weights.transpose(1, 2) @ v  # (B, H, T, S) @ (B, H, S, Dv/H) -> (B, H, T, Dv/H)
        context = context.transpose(1, 2).reshape(B, T, Dv)  # concatenate the heads
        return context, weights.mean(dim=2)  # (B, T, Dv), (B, T, S)
