"""The attention scorers: each maps a query and keys to energies, nothing else.

The scorer contract is in :mod:`seq2seq.models.attention`, an example of a user-defined scorer
in docs/models.md#writing-your-own-scorer; config files name these classes by registry name
(:mod:`seq2seq.models.registry`).
"""

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn


class Scorer(nn.Module):
    """Base class of attention scorers: identity ``precompute_keys`` and ``num_heads = 1``.

    Subclasses implement :meth:`score` and, when some work depends on the keys only, override
    :meth:`precompute_keys` so that it runs once per source batch instead of once per step.
    Dq and Dk in the scorers' shapes are ``query_dim`` (the decoder state's size) and
    ``key_dim`` (the encoder outputs').
    """

    num_heads: int = 1

    def precompute_keys(self, keys: Tensor) -> Tensor:
        """Keys (B, S, Dk) -> what :meth:`score` reuses (contract in :mod:`~.attention`)."""
        return keys

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        """Unnormalized energies (B, T, S) (contract in :mod:`~.attention`)."""
        raise NotImplementedError


class AdditiveScorer(Scorer):
    """Additive (Bahdanau) attention: e = v^T tanh(W_q q + W_k k + b).

    W_k k + b depends on the keys only, so :meth:`precompute_keys` computes it once per batch.
    The hidden layer has one A-vector per (step, position) pair, built here at once; training
    and decoding swap in a kernel that builds it in chunks (:mod:`seq2seq.ops`).

    Args:
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
        q = self.query_proj(query)  # W_q q: (B, T, A)
        hidden = torch.tanh(q.unsqueeze(2) + keys.unsqueeze(1))  # (B, T, 1, A) + (B, 1, S, A)
        return self.v(hidden).squeeze(-1)  # (B, T, S, A) -> (B, T, S)


class DotScorer(Scorer):
    """Dot-product (Luong dot) attention: e = q^T k, or q^T P k with ``project_keys``.

    Without a projection the dot product needs ``query_dim == key_dim``. With
    ``project_keys=True`` a learned P (key_dim -> query_dim, no bias) is applied once per batch in
    :meth:`precompute_keys`, which makes this the same model as :class:`GeneralScorer`.

    Args:
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
    not saturate as d grows. Options, errors and shapes are those of :class:`DotScorer`.
    """

    def __init__(self, *, query_dim: int, key_dim: int, project_keys: bool = False):
        super().__init__(query_dim=query_dim, key_dim=key_dim, project_keys=project_keys)
        self.scale = 1.0 / math.sqrt(query_dim)

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        return super().score(query, keys) * self.scale  # (B, T, S)


class GeneralScorer(Scorer):
    """General (Luong general, bilinear) attention: e = q^T W k (/ sqrt(d) with ``scale``).

    W k depends on the keys only, so :meth:`precompute_keys` computes it once per batch.
    d = ``query_dim`` is the length of the dot product, as in :class:`ScaledDotScorer`: unscaled,
    the energies grow with d and the softmax can saturate (Britz et al. 2017).

    Args:
        scale: Divide the energies by sqrt(d); false (Luong's formula) by default.

    Shape:
        - precompute_keys: (B, S, Dk) -> (B, S, Dq)
        - score: query (B, T, Dq), keys (B, S, Dq) -> (B, T, S)
    """

    def __init__(self, *, query_dim: int, key_dim: int, scale: bool = False):
        super().__init__()
        # No bias: q^T (W k + c) adds q^T c, the same for every position, which softmax ignores.
        self.key_proj = nn.Linear(key_dim, query_dim, bias=False)
        self.scale = 1.0 / math.sqrt(query_dim) if scale else None

    def precompute_keys(self, keys: Tensor) -> Tensor:
        return self.key_proj(keys)  # (B, S, Dq)

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        energies = query @ keys.transpose(1, 2)  # (B, T, Dq) @ (B, Dq, S) -> (B, T, S)
        return energies if self.scale is None else energies * self.scale


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


class GaussianScorer(Scorer):
    """Kernel (Nadaraya-Watson) attention over distances: e = log K(||W_q q - W_k k - b|| / h).

    ``kernel="gaussian"``: e = -d^2 / (2 h^2), so the softmax weights are the normalized Gaussian
    kernel exp(-d^2 / 2h^2). ``kernel="epanechnikov"``: e = log(max(u, floor)),
    u = 1 - d^2 / h^2, so the softmax weights are max(u, floor) / sum(...): exactly the normalized
    Epanechnikov kernel max(0, u) wherever it is positive, plus ``floor`` (1e-6) outside the
    window. The floor keeps the energies finite, gives a uniform row instead of 0/0 when no
    position lies within h, and is the only approximation; outside the window there is no
    gradient, so h starts wide (see ``sigma``).

    The bandwidth h = exp(log_h) is learned (the log keeps it positive). The squared distances
    come from one batched product, d^2 = |q'|^2 - 2 q'.k' + |k'|^2 (clamped at 0 against
    rounding), never a (B, T, S, A) tensor; k' = W_k k + b and |k'|^2 are computed once per batch.

    Args:
        hidden_size: Size A of the space the distances are measured in; ``None`` means
            ``query_dim``.
        kernel: ``"gaussian"`` or ``"epanechnikov"``.
        sigma: Initial bandwidth h; ``None`` means sqrt(A) for the Gaussian kernel and
            2 sqrt(A) for the Epanechnikov kernel (about the spread of distances between
            freshly initialized projections of unit-size vectors).

    Shape:
        - precompute_keys: (B, S, Dk) -> (B, S, A + 1), k' with |k'|^2 as the last column
        - score: query (B, T, Dq), keys (B, S, A + 1) -> (B, T, S)
    """

    KERNELS = ("gaussian", "epanechnikov")
    FLOOR = 1e-6  # Epanechnikov weight outside the window, relative to 1 at distance 0

    def __init__(
        self,
        *,
        query_dim: int,
        key_dim: int,
        hidden_size: int | None = None,
        kernel: str = "gaussian",
        sigma: float | None = None,
    ):
        super().__init__()
        if kernel not in self.KERNELS:
            raise ValueError(
                f"model.attention.kernel must be one of {', '.join(self.KERNELS)}, got {kernel!r}"
            )
        hidden_size = query_dim if hidden_size is None else hidden_size
        if sigma is None:
            sigma = math.sqrt(hidden_size) * (1.0 if kernel == "gaussian" else 2.0)
        if sigma <= 0:
            raise ValueError(f"model.attention.sigma must be positive, got {sigma}")
        self.kernel = kernel
        # One bias is enough: only the difference W_q q - (W_k k + b) matters.
        self.query_proj = nn.Linear(query_dim, hidden_size, bias=False)
        self.key_proj = nn.Linear(key_dim, hidden_size)
        self.log_sigma = nn.Parameter(torch.tensor(math.log(sigma)))

    def precompute_keys(self, keys: Tensor) -> Tensor:
        k = self.key_proj(keys)  # (B, S, A)
        return torch.cat([k, k.pow(2).sum(-1, keepdim=True)], dim=-1)  # (B, S, A + 1)

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        q = self.query_proj(query)  # (B, T, A)
        k, k_sq = keys[..., :-1], keys[..., -1]  # (B, S, A), (B, S)
        dist_sq = q.pow(2).sum(-1, keepdim=True) - 2 * q @ k.transpose(1, 2) + k_sq[:, None, :]
        scaled = dist_sq.clamp(min=0) * torch.exp(-2 * self.log_sigma)  # d^2 / h^2, (B, T, S)
        if self.kernel == "gaussian":
            return -0.5 * scaled
        return torch.log((1 - scaled).clamp(min=self.FLOOR))


class LocationScorer(Scorer):
    """Location-based (Luong) attention: e = W_a h, from the decoder state alone.

    One energy per source position 0 .. ``max_length`` - 1, whatever the keys hold; the shared
    :class:`Attention` masks the padding. A source longer than ``max_length`` still works:
    its positions from ``max_length`` on get energy -inf, i.e. exactly zero weight, so only the
    first ``max_length`` positions can be attended to (the tail, EOS included, contributes
    nothing to the context). Set ``max_length`` to at least the longest training source.

    Args:
        max_length: Number of source positions with an energy.

    Shape:
        - precompute_keys: (B, S, Dk) -> (B, S, 0), only the batch and length are needed
        - score: query (B, T, Dq), keys (B, S, *) -> (B, T, S)
    """

    def __init__(self, *, query_dim: int, key_dim: int, max_length: int = 128):
        super().__init__()
        if max_length < 1:
            raise ValueError(f"model.attention.max_length must be >= 1, got {max_length}")
        self.max_length = max_length
        self.position_proj = nn.Linear(query_dim, max_length)

    def precompute_keys(self, keys: Tensor) -> Tensor:
        return keys[..., :0]  # (B, S, 0): keeps the batch (beam search) and the length S

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        S = keys.size(1)
        energies = self.position_proj(query)[..., :S]  # (B, T, min(S, max_length))
        # Positions past max_length (none for shorter sources) get zero weight.
        past = S - energies.size(-1)
        return nn.functional.pad(energies, (0, past), value=float("-inf"))  # (B, T, S)
