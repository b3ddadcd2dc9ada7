"""Attention: pluggable scorers plus the one module that turns their energies into a context.

A *scorer* only computes energies e[b, t, s]: how well decoder step t of sentence b matches
source position s. Everything else (padding mask, softmax, weighted sum of the values) lives in
:class:`Attention`, so a new scorer never has to get masking or numerics right.

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

A user-defined scorer takes a few lines; plug it in with
``model.attention._target_=my_module.CosineScorer``::

    import torch.nn.functional as F
    from torch import nn
    from seq2seq.models.attention import Scorer

    class CosineScorer(Scorer):  # e = scale * cos(q, W k)
        def __init__(self, *, query_dim: int, key_dim: int, scale: float = 10.0):
            super().__init__()
            self.key_proj = nn.Linear(key_dim, query_dim, bias=False)
            self.scale = scale  # cosines lie in [-1, 1]: unscaled, the softmax is nearly flat

        def precompute_keys(self, keys):
            return F.normalize(self.key_proj(keys), dim=-1)  # (B, S, Dq)

        def score(self, query, keys):
            return self.scale * F.normalize(query, dim=-1) @ keys.transpose(1, 2)  # (B, T, S)
"""

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn


class Scorer(nn.Module):
    """Base class of attention scorers: identity ``precompute_keys`` and ``num_heads = 1``.

    Subclasses implement :meth:`score` and, when some work depends on the keys only, override
    :meth:`precompute_keys` so that it runs once per source batch instead of once per step.
    """

    num_heads: int = 1

    def precompute_keys(self, keys: Tensor) -> Tensor:
        """Return what :meth:`score` needs from the keys; the identity by default.

        Args:
            keys: Encoder outputs.

        Returns:
            The precomputed keys, to pass back to :meth:`score`.

        Shape:
            - keys: (B, S, Dk)
            - output: (B, S, *), scorer-specific.
        """
        return keys

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        """Return the energies of every query step against every key.

        Args:
            query: Decoder states, T steps at once.
            keys: The output of :meth:`precompute_keys`.

        Returns:
            Unnormalized energies (no mask, no softmax).

        Shape:
            - query: (B, T, Dq)
            - keys: (B, S, *)
            - output: (B, T, S)
        """
        raise NotImplementedError


class AdditiveScorer(Scorer):
    """Additive (Bahdanau) attention: e = v^T tanh(W_q q + W_k k + b).

    W_k k + b depends on the keys only, so :meth:`precompute_keys` computes it once per batch.
    The tanh needs every (step, position) pair, so :meth:`score` builds a (B, T, S, A) tensor.

    Args:
        query_dim: Size Dq of the query (decoder state).
        key_dim: Size Dk of the keys (encoder outputs).
        hidden_size: Size A of the hidden layer; ``None`` means ``query_dim``.

    Shape:
        - precompute_keys: (B, S, Dk) -> (B, S, A)
        - score: query (B, T, Dq), keys (B, S, A) -> (B, T, S)
    """

    def __init__(self, *, query_dim: int, key_dim: int, hidden_size: int | None = None):
        super().__init__()
        hidden_size = query_dim if hidden_size is None else hidden_size
        # One bias is enough: a bias on both projections would just add up.
        self.query_proj = nn.Linear(query_dim, hidden_size, bias=False)
        self.key_proj = nn.Linear(key_dim, hidden_size)
        # No bias on v: adding a constant to every energy does not change the softmax.
        self.v = nn.Linear(hidden_size, 1, bias=False)

    def precompute_keys(self, keys: Tensor) -> Tensor:
        return self.key_proj(keys)  # (B, S, A)

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        q = self.query_proj(query)  # (B, T, A)
        hidden = torch.tanh(q.unsqueeze(2) + keys.unsqueeze(1))  # (B, T, S, A)
        return self.v(hidden).squeeze(-1)  # (B, T, S)


class DotScorer(Scorer):
    """Dot-product (Luong dot) attention: e = q^T k, or q^T P k with ``project_keys``.

    Without a projection the dot product needs ``query_dim == key_dim``. With
    ``project_keys=True`` a learned P (key_dim -> query_dim, no bias) is applied once per batch in
    :meth:`precompute_keys`, which makes this the same model as :class:`GeneralScorer`.

    Args:
        query_dim: Size Dq of the query.
        key_dim: Size Dk of the keys.
        project_keys: Learn a projection of the keys to ``query_dim``.

    Raises:
        ValueError: If ``query_dim != key_dim`` and ``project_keys`` is false.

    Shape:
        - precompute_keys: (B, S, Dk) -> (B, S, Dq)
        - score: query (B, T, Dq), keys (B, S, Dq) -> (B, T, S)
    """

    def __init__(self, *, query_dim: int, key_dim: int, project_keys: bool = False):
        super().__init__()
        if query_dim != key_dim and not project_keys:
            raise ValueError(
                f"{type(self).__name__} takes the dot product of query and key, but "
                f"query_dim={query_dim} != key_dim={key_dim}. Set "
                f"model.attention.project_keys=true to learn a key projection, or choose another "
                f"scorer (e.g. model/attention=general or additive)."
            )
        # No bias: q^T (P k + c) adds q^T c, the same for every position, which softmax ignores.
        self.key_proj = nn.Linear(key_dim, query_dim, bias=False) if project_keys else None

    def precompute_keys(self, keys: Tensor) -> Tensor:
        return keys if self.key_proj is None else self.key_proj(keys)  # (B, S, Dq)

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        return query @ keys.transpose(1, 2)  # (B, T, Dq) @ (B, Dq, S) -> (B, T, S)


class ScaledDotScorer(DotScorer):
    """Scaled dot-product attention: e = q^T k / sqrt(d), d = ``query_dim``.

    d is the length of the dot product (the keys have ``query_dim`` entries, projected or not).
    The scaling keeps the energies' variance near 1 for unit-variance inputs, so the softmax does
    not saturate as d grows. Options and errors are those of :class:`DotScorer`.

    Shape:
        - precompute_keys: (B, S, Dk) -> (B, S, Dq)
        - score: query (B, T, Dq), keys (B, S, Dq) -> (B, T, S)
    """

    def __init__(self, *, query_dim: int, key_dim: int, project_keys: bool = False):
        super().__init__(query_dim=query_dim, key_dim=key_dim, project_keys=project_keys)
        self.scale = 1.0 / math.sqrt(query_dim)

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        return super().score(query, keys) * self.scale  # (B, T, S)


class GeneralScorer(Scorer):
    """General (Luong general, bilinear) attention: e = q^T W k.

    W k depends on the keys only, so :meth:`precompute_keys` computes it once per batch.

    Args:
        query_dim: Size Dq of the query.
        key_dim: Size Dk of the keys.

    Shape:
        - precompute_keys: (B, S, Dk) -> (B, S, Dq)
        - score: query (B, T, Dq), keys (B, S, Dq) -> (B, T, S)
    """

    def __init__(self, *, query_dim: int, key_dim: int):
        super().__init__()
        # No bias: q^T (W k + c) adds q^T c, the same for every position, which softmax ignores.
        self.key_proj = nn.Linear(key_dim, query_dim, bias=False)

    def precompute_keys(self, keys: Tensor) -> Tensor:
        return self.key_proj(keys)  # (B, S, Dq)

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        return query @ keys.transpose(1, 2)  # (B, T, Dq) @ (B, Dq, S) -> (B, T, S)


class MultiHeadScorer(Scorer):
    """Multi-head attention energies (as in RNMT+), any single-head scorer per head.

    e_h = inner(Q_h q, K_h k) for h = 1..H, where Q_h and K_h are the h-th ``head_dim`` slices
    of a query projection (Dq -> H * head_dim) and a key projection (Dk -> H * head_dim). One
    inner scorer, built as ``scorer(query_dim=head_dim, key_dim=head_dim)``, is shared by all
    heads; it runs once with the heads folded into the batch dimension, its own
    ``precompute_keys`` included.

    :class:`Attention` splits the values (B, S, Dv) into H equal slices, one per head, and
    concatenates the per-head contexts back to Dv; hence ``key_dim`` (normally = Dv, both being
    the encoder outputs) must be divisible by ``heads``.

    Args:
        query_dim: Size Dq of the query.
        key_dim: Size Dk of the keys.
        heads: Number of heads H.
        scorer: Factory of the inner, single-head scorer (e.g. ``functools.partial`` of a class).
        head_dim: Size of each head's projected query and key; ``None`` means ``key_dim // heads``.

    Raises:
        ValueError: If ``heads < 1``, ``key_dim`` is not divisible by ``heads``, or the inner
            scorer is itself multi-head.

    Shape:
        - precompute_keys: (B, S, Dk) -> (B, H, S, *), the inner scorer's precomputed keys
        - score: query (B, T, Dq), keys (B, H, S, *) -> (B, T, H, S)
    """

    def __init__(
        self,
        *,
        query_dim: int,
        key_dim: int,
        heads: int,
        scorer: Callable[..., nn.Module],
        head_dim: int | None = None,
    ):
        super().__init__()
        if heads < 1:
            raise ValueError(f"MultiHeadScorer needs heads >= 1, got heads={heads}.")
        if key_dim % heads != 0:
            raise ValueError(
                f"MultiHeadScorer splits the values into one slice per head, so key_dim={key_dim} "
                f"must be divisible by heads={heads}. Change model.attention.heads."
            )
        self.num_heads = heads
        self.head_dim = key_dim // heads if head_dim is None else head_dim
        # No biases: the inner scorer has its own where they matter.
        self.query_proj = nn.Linear(query_dim, heads * self.head_dim, bias=False)
        self.key_proj = nn.Linear(key_dim, heads * self.head_dim, bias=False)
        self.inner = scorer(query_dim=self.head_dim, key_dim=self.head_dim)
        if getattr(self.inner, "num_heads", 1) != 1:
            raise ValueError("MultiHeadScorer's inner scorer must be single-head.")

    def _fold_heads(self, x: Tensor) -> Tensor:
        """(B, L, H * head_dim) -> (B * H, L, head_dim): each head becomes its own batch row."""
        B, L, _ = x.shape
        x = x.view(B, L, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, L, head_dim)
        return x.reshape(B * self.num_heads, L, self.head_dim)

    def precompute_keys(self, keys: Tensor) -> Tensor:
        B = keys.size(0)
        k = self._fold_heads(self.key_proj(keys))  # (B * H, S, head_dim)
        k = self.inner.precompute_keys(k)  # (B * H, S, *)
        # Unfold the heads again: callers index the precomputed keys by sentence (dim 0).
        return k.unflatten(0, (B, self.num_heads))  # (B, H, S, *)

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        B, T, _ = query.shape
        q = self._fold_heads(self.query_proj(query))  # (B * H, T, head_dim)
        energies = self.inner.score(q, keys.flatten(0, 1))  # (B * H, T, S)
        energies = energies.view(B, self.num_heads, T, -1)  # (B, H, T, S)
        return energies.transpose(1, 2)  # (B, T, H, S)


class Attention(nn.Module):
    """Masked softmax attention around a scorer: energies -> weights -> context.

    This module alone applies the padding mask, the softmax over source positions and the
    weighted sum of the values, for any scorer. With a multi-head scorer (4-D energies), head h
    attends over the h-th of H equal slices of every value vector; the per-head contexts are
    concatenated back to Dv and the returned weights are averaged over the heads.

    Args:
        scorer: A scorer following the contract in this module's docstring.

    Shape:
        - query: (B, T, Dq)
        - keys: the output of :meth:`precompute_keys`
        - values: (B, S, Dv)
        - mask: (B, S), bool, True at real tokens
        - context: (B, T, Dv)
        - weights: (B, T, S)
    """

    def __init__(self, scorer: nn.Module):
        super().__init__()
        self.scorer = scorer

    def precompute_keys(self, keys: Tensor) -> Tensor:
        """Run the scorer's once-per-batch key work; pass the result to every :meth:`forward`."""
        return self.scorer.precompute_keys(keys)

    def forward(
        self, query: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Attend from T query steps over S source positions.

        Args:
            query: Decoder states.
            keys: The output of :meth:`precompute_keys`.
            values: Vectors to average, usually the encoder outputs.
            mask: True at real tokens, False at padding; ``None`` means no padding. Every row
                needs at least one real token.

        Returns:
            The context vectors and the attention weights (exactly 0 at padding).

        Shape:
            - query: (B, T, Dq)
            - values: (B, S, Dv)
            - mask: (B, S)
            - context: (B, T, Dv)
            - weights: (B, T, S)
        """
        energies = self.scorer.score(query, keys)  # (B, T, S) or (B, T, H, S)
        multi_head = energies.dim() == 4
        # Softmax in at least float32: in bf16/fp16 (autocast) the exp and the normalizing sum
        # lose too much precision. float64 stays float64.
        energies = energies.to(torch.promote_types(energies.dtype, torch.float32))
        if mask is not None:
            # -inf makes exp() exactly 0, so padded positions get exactly zero weight.
            pad = ~mask[:, None, None, :] if multi_head else ~mask[:, None, :]  # broadcast
            energies = energies.masked_fill(pad, float("-inf"))
        weights = torch.softmax(energies, dim=-1).to(values.dtype)  # (B, T, [H,] S)
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
