"""Tests of the attention scorers and the shared Attention module.

Every scorer is checked against a direct, loop-based computation of its formula from its own
parameters (float64), then for the properties the decoders rely on: masking, shapes, T steps at
once == T single steps, precomputed keys returned (not stored) and batch-first, gradients.
Sparsemax is checked against hand-computed examples and its optimality conditions, and every
scorer is run through it.
"""

import math
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

from seq2seq import CONFIG_DIR
from seq2seq.models.attention import (
    AdditiveScorer,
    Attention,
    DotScorer,
    GaussianScorer,
    GeneralScorer,
    LocationScorer,
    MultiHeadScorer,
    ScaledDotScorer,
    Scorer,
    sparsemax,
)
from seq2seq.models.build import resolve_targets, split_attention_config
from seq2seq.models.registry import SCORER

ATTENTION_CONFIGS = CONFIG_DIR / "model" / "attention"
DOCS_MODELS = Path(__file__).resolve().parents[1] / "docs" / "models.md"


class CosineScorer(Scorer):  # e = scale * cos(q, W k); the example of docs/models.md
    def __init__(self, *, query_dim: int, key_dim: int, scale: float = 10.0):
        super().__init__()
        self.key_proj = nn.Linear(key_dim, query_dim, bias=False)
        self.scale = scale  # cosines lie in [-1, 1]: unscaled, the softmax is nearly flat

    def precompute_keys(self, keys):
        return F.normalize(self.key_proj(keys), dim=-1)  # (B, S, Dq)

    def score(self, query, keys):
        return self.scale * F.normalize(query, dim=-1) @ keys.transpose(1, 2)  # (B, T, S)


# name -> (factory, query_dim, key_dim). Values have key_dim entries (they are the keys).
CASES = {
    "additive": (partial(AdditiveScorer, hidden_size=5), 6, 4),
    "dot": (DotScorer, 4, 4),
    "dot_projected": (partial(DotScorer, project_keys=True), 6, 4),
    "scaled_dot": (ScaledDotScorer, 4, 4),
    "scaled_dot_projected": (partial(ScaledDotScorer, project_keys=True), 6, 4),
    "general": (GeneralScorer, 6, 4),
    "general_scaled": (partial(GeneralScorer, scale=True), 6, 4),
    "multihead_additive": (
        partial(MultiHeadScorer, heads=2, scorer=partial(AdditiveScorer, hidden_size=3)),
        6,
        4,
    ),
    "multihead_dot": (partial(MultiHeadScorer, heads=2, head_dim=3, scorer=DotScorer), 6, 4),
    "cosine": (CosineScorer, 6, 4),
    "gaussian": (partial(GaussianScorer, hidden_size=5), 6, 4),
    "epanechnikov": (partial(GaussianScorer, hidden_size=5, kernel="epanechnikov"), 6, 4),
    "multihead_gaussian": (partial(MultiHeadScorer, heads=2, scorer=GaussianScorer), 6, 4),
    "location": (partial(LocationScorer, max_length=8), 6, 4),
}
KEY_INDEPENDENT = {"location"}  # energies from the query alone


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def make(name: str) -> tuple[nn.Module, int, int]:
    """A float64 scorer with non-trivial parameters, and its query and key sizes."""
    factory, query_dim, key_dim = CASES[name]
    scorer = factory(query_dim=query_dim, key_dim=key_dim).double()
    return scorer, query_dim, key_dim


def inputs(B: int, T: int, S: int, query_dim: int, key_dim: int, lengths=None):
    """query (B, T, Dq), keys = values (B, S, Dk), mask (B, S) from per-sentence lengths."""
    query = torch.randn(B, T, query_dim, dtype=torch.float64)
    keys = torch.randn(B, S, key_dim, dtype=torch.float64)
    lengths = torch.full((B,), S) if lengths is None else torch.tensor(lengths)
    mask = torch.arange(S)[None, :] < lengths[:, None]
    return query, keys, mask


# ---------------------------------------------------------------- loop-based references


def ref_pair(scorer: nn.Module, q: torch.Tensor, k: torch.Tensor, s: int) -> torch.Tensor:
    """Energy of one query vector (Dq,) and one raw key vector (Dk,) at source position s,
    straight from the formula.

    Returns a scalar, or one energy per head (H,) for a multi-head scorer.
    """
    if isinstance(scorer, MultiHeadScorer):
        d = scorer.head_dim
        qp, kp = scorer.query_proj.weight @ q, scorer.key_proj.weight @ k
        heads = [slice(h * d, (h + 1) * d) for h in range(scorer.num_heads)]
        return torch.stack([ref_pair(scorer.inner, qp[h], kp[h], s) for h in heads])
    if isinstance(scorer, AdditiveScorer):  # v^T tanh(W_q q + W_k k + b)
        hidden = torch.tanh(
            scorer.query_proj.weight @ q + scorer.key_proj.weight @ k + scorer.key_proj.bias
        )
        return scorer.v.weight[0] @ hidden
    if isinstance(scorer, DotScorer):  # q^T k (or q^T P k), / sqrt(d) when scaled
        if scorer.key_proj is not None:
            k = scorer.key_proj.weight @ k
        energy = sum(q[i] * k[i] for i in range(q.numel()))
        return energy / math.sqrt(q.numel()) if isinstance(scorer, ScaledDotScorer) else energy
    if isinstance(scorer, GeneralScorer):  # q^T W k, / sqrt(d) when scaled
        energy = q @ (scorer.key_proj.weight @ k)
        return energy if scorer.scale is None else energy / math.sqrt(q.numel())
    if isinstance(scorer, CosineScorer):  # scale * cos(q, W k)
        wk = scorer.key_proj.weight @ k
        return scorer.scale * (q @ wk) / (q.norm() * wk.norm())
    if isinstance(scorer, GaussianScorer):  # log K(||W_q q - W_k k - b|| / h)
        diff = scorer.query_proj.weight @ q - scorer.key_proj.weight @ k - scorer.key_proj.bias
        dist_sq = sum(diff[i] ** 2 for i in range(diff.numel()))
        h_sq = math.exp(scorer.log_sigma.item()) ** 2
        if scorer.kernel == "gaussian":
            return -dist_sq / (2 * h_sq)
        return torch.log(torch.clamp(1 - dist_sq / h_sq, min=1e-6))
    if isinstance(scorer, LocationScorer):  # (W_a q + b)[s], -inf past max_length
        if s >= scorer.max_length:
            return torch.tensor(float("-inf"), dtype=q.dtype)
        return scorer.position_proj.weight[s] @ q + scorer.position_proj.bias[s]
    raise TypeError(type(scorer))


def ref_energies(scorer, query, keys):
    """Energies (B, T, S) or (B, T, H, S) by explicit loops over batch, step and position."""
    B, T, S = query.size(0), query.size(1), keys.size(1)
    return torch.stack(
        [
            torch.stack(
                [
                    torch.stack(
                        [ref_pair(scorer, query[b, t], keys[b, s], s) for s in range(S)], -1
                    )
                    for t in range(T)
                ]
            )
            for b in range(B)
        ]
    )


def ref_sparsemax(z: list[float]) -> list[float]:
    """Sparsemax of a list, -inf allowed, by the sorted-threshold rule in plain Python."""
    ordered = sorted((x for x in z if x != float("-inf")), reverse=True)
    support, total = 0, 0.0
    for k, x in enumerate(ordered, start=1):
        if 1 + k * x > total + x:
            support, total = k, total + x
        else:
            break
    tau = (total - 1) / support
    return [max(x - tau, 0.0) for x in z]


def ref_attention(scorer, query, keys, values, mask, normalizer="softmax"):
    """Context (B, T, Dv) and head-averaged weights (B, T, S) by explicit loops."""
    B, T, S = query.size(0), query.size(1), keys.size(1)
    H, Dv = scorer.num_heads, values.size(-1)
    d = Dv // H
    energies = ref_energies(scorer, query, keys).view(B, T, H, S)  # single head: H = 1
    context = torch.zeros(B, T, Dv, dtype=values.dtype)
    weights = torch.zeros(B, T, S, dtype=values.dtype)
    for b in range(B):
        real = [s for s in range(S) if mask[b, s]]
        for t in range(T):
            for h in range(H):
                if normalizer == "softmax":
                    exps = {s: math.exp(energies[b, t, h, s].item()) for s in real}
                    probs = {s: e / sum(exps.values()) for s, e in exps.items()}
                else:
                    row = [energies[b, t, h, s].item() for s in real]
                    probs = dict(zip(real, ref_sparsemax(row), strict=True))
                for s in real:
                    w = probs[s]
                    context[b, t, h * d : (h + 1) * d] += w * values[b, s, h * d : (h + 1) * d]
                    weights[b, t, s] += w / H
    return context, weights


# ---------------------------------------------------------------- formulas


@pytest.mark.parametrize("name", CASES)
def test_energies_match_loop_reference(name):
    scorer, query_dim, key_dim = make(name)
    query, keys, _ = inputs(2, 3, 5, query_dim, key_dim)
    energies = scorer.score(query, scorer.precompute_keys(keys))
    torch.testing.assert_close(energies, ref_energies(scorer, query, keys), rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", CASES)
def test_attention_matches_loop_reference(name):
    scorer, query_dim, key_dim = make(name)
    query, keys, mask = inputs(3, 2, 5, query_dim, key_dim, lengths=[5, 3, 1])
    attention = Attention(scorer)
    context, weights = attention(query, attention.precompute_keys(keys), keys, mask)
    ref_context, ref_weights = ref_attention(scorer, query, keys, keys, mask)
    torch.testing.assert_close(context, ref_context, rtol=0, atol=1e-6)
    torch.testing.assert_close(weights, ref_weights, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", CASES)
def test_sparsemax_attention_matches_loop_reference(name):
    scorer, query_dim, key_dim = make(name)
    query, keys, mask = inputs(3, 2, 5, query_dim, key_dim, lengths=[5, 3, 1])
    attention = Attention(scorer, normalizer="sparsemax")
    context, weights = attention(query, attention.precompute_keys(keys), keys, mask)
    ref_context, ref_weights = ref_attention(scorer, query, keys, keys, mask, "sparsemax")
    torch.testing.assert_close(context, ref_context, rtol=0, atol=1e-6)
    torch.testing.assert_close(weights, ref_weights, rtol=0, atol=1e-6)
    assert torch.all(weights[~mask[:, None, :].expand_as(weights)] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 2, dtype=torch.float64))


def test_scaled_dot_is_dot_over_sqrt_d():
    query, keys, _ = inputs(2, 3, 4, 9, 9)
    dot = DotScorer(query_dim=9, key_dim=9).score(query, keys)
    scaled = ScaledDotScorer(query_dim=9, key_dim=9).score(query, keys)
    torch.testing.assert_close(scaled, dot / 3.0)


# ---------------------------------------------------------------- sparsemax


@pytest.mark.parametrize(
    "z,expected",
    [
        ([1.0, 0.5, -1.0], [0.75, 0.25, 0.0]),  # tau = (1 + 0.5 - 1) / 2
        ([0.0, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3]),
        ([3.0, 0.0], [1.0, 0.0]),
        ([0.2, float("-inf"), 0.0, float("-inf")], [0.6, 0.0, 0.4, 0.0]),  # tau = -0.4
        ([5.0], [1.0]),
    ],
)
def test_sparsemax_closed_form_examples(z, expected):
    z = torch.tensor(z, dtype=torch.float64)
    torch.testing.assert_close(sparsemax(z), torch.tensor(expected, dtype=torch.float64))
    torch.testing.assert_close(sparsemax(z + 7.0), sparsemax(z))  # shift-invariant
    assert ref_sparsemax(z.tolist()) == pytest.approx(expected)


def test_sparsemax_is_the_projection_onto_the_simplex():
    # KKT conditions of argmin ||p - z||^2 over the simplex: p = z - tau on the support and
    # z <= tau off it, for one tau per row; rows sum to 1.
    z = 2 * torch.randn(6, 3, 9, dtype=torch.float64)
    p = sparsemax(z)
    assert torch.all(p >= 0)
    torch.testing.assert_close(p.sum(-1), torch.ones(6, 3, dtype=torch.float64))
    tau = ((z - p) * (p > 0)).sum(-1, keepdim=True) / (p > 0).sum(-1, keepdim=True)
    torch.testing.assert_close(torch.where(p > 0, z - tau, p), p)
    assert torch.all(z[p == 0] <= tau.expand_as(z)[p == 0])
    # along another dim: the same as transposing
    torch.testing.assert_close(sparsemax(z, dim=1), sparsemax(z.transpose(1, 2)).transpose(1, 2))


def test_sparsemax_peaked_rows_are_sparse_and_masked_exactly_zero():
    scorer = DotScorer(query_dim=4, key_dim=4).double()
    query, keys, mask = inputs(3, 4, 6, 4, 4, lengths=[6, 2, 4])
    query = 5 * query  # peaked energies: some real positions must get exactly zero
    attention = Attention(scorer, normalizer="sparsemax")
    _, weights = attention(query, keys, keys, mask)
    mask = mask[:, None, :].expand_as(weights)
    assert torch.all(weights[~mask] == 0)
    assert (weights[mask] == 0).any()
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, dtype=torch.float64))
    softmax_weights = Attention(scorer)(query, keys, keys, mask[:, 0])[1]
    assert torch.all(softmax_weights[mask] > 0)


def test_sparsemax_gradcheck():
    z = torch.randn(3, 2, 5, dtype=torch.float64)
    z[0, 0, 3:] = float("-inf")  # padding
    z.requires_grad_()
    assert torch.autograd.gradcheck(lambda z: sparsemax(z).masked_fill(z.isinf(), 0), (z,))
    sparsemax(z).sum().backward()
    assert torch.all(z.grad[z.isinf()] == 0)


@pytest.mark.parametrize("name", ["additive", "general", "gaussian", "location",
                                  "multihead_dot"])
def test_sparsemax_attention_gradcheck(name):
    scorer, query_dim, key_dim = make(name)
    query, keys, mask = inputs(2, 2, 3, query_dim, key_dim, lengths=[3, 2])
    values = torch.randn(2, 3, key_dim, dtype=torch.float64)
    attention = Attention(scorer, normalizer="sparsemax")

    def attend(query, keys, values):
        return attention(query, attention.precompute_keys(keys), values, mask)

    tensors = tuple(t.requires_grad_() for t in (query, keys, values))
    assert torch.autograd.gradcheck(attend, tensors)


def test_unknown_normalizer_is_a_clear_error():
    with pytest.raises(ValueError, match=r"normalizer must be one of softmax, sparsemax.*'max'"):
        Attention(DotScorer(query_dim=4, key_dim=4), normalizer="max")


# ---------------------------------------------------------------- masking


@pytest.mark.parametrize("name", CASES)
def test_padding_gets_exactly_zero_weight(name):
    scorer, query_dim, key_dim = make(name)
    query, keys, mask = inputs(3, 4, 6, query_dim, key_dim, lengths=[6, 2, 4])
    attention = Attention(scorer)
    _, weights = attention(query, attention.precompute_keys(keys), keys, mask)
    mask = mask[:, None, :].expand_as(weights)
    assert torch.all(weights[~mask] == 0)
    assert torch.all(weights[mask] > 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, dtype=torch.float64))


@pytest.mark.parametrize("name", CASES)
def test_padded_keys_and_values_do_not_matter(name):
    scorer, query_dim, key_dim = make(name)
    query, keys, mask = inputs(2, 3, 5, query_dim, key_dim, lengths=[5, 2])
    attention = Attention(scorer)
    context, weights = attention(query, attention.precompute_keys(keys), keys, mask)

    noisy = keys.clone()
    noisy[~mask] = 100 * torch.randn_like(noisy[~mask])
    noisy_context, noisy_weights = attention(query, attention.precompute_keys(noisy), noisy, mask)
    torch.testing.assert_close(noisy_context, context)
    torch.testing.assert_close(noisy_weights, weights)


# ---------------------------------------------------------------- shapes and steps


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("B,T,S", [(2, 1, 5), (2, 4, 5), (1, 3, 4), (3, 2, 1), (1, 1, 1)])
def test_shapes(name, B, T, S):
    scorer, query_dim, key_dim = make(name)
    query, keys, mask = inputs(B, T, S, query_dim, key_dim)
    attention = Attention(scorer)
    precomputed = attention.precompute_keys(keys)
    assert precomputed.size(0) == B  # batch-first, for beam search's index_select
    energies = scorer.score(query, precomputed)
    H = scorer.num_heads
    assert energies.shape == ((B, T, S) if H == 1 else (B, T, H, S))
    context, weights = attention(query, precomputed, keys, mask)
    assert context.shape == (B, T, key_dim)
    assert weights.shape == (B, T, S)
    if S == 1:  # a single source position takes all the weight
        assert torch.all(weights == 1)
        torch.testing.assert_close(context, keys.expand(B, T, key_dim))


@pytest.mark.parametrize("name", CASES)
def test_all_steps_at_once_equal_single_steps(name):
    scorer, query_dim, key_dim = make(name)
    query, keys, mask = inputs(2, 4, 5, query_dim, key_dim, lengths=[5, 3])
    attention = Attention(scorer)
    precomputed = attention.precompute_keys(keys)
    context, weights = attention(query, precomputed, keys, mask)
    for t in range(4):
        step_context, step_weights = attention(query[:, t : t + 1], precomputed, keys, mask)
        torch.testing.assert_close(step_context, context[:, t : t + 1])
        torch.testing.assert_close(step_weights, weights[:, t : t + 1])
        torch.testing.assert_close(
            scorer.score(query[:, t : t + 1], precomputed),
            scorer.score(query, precomputed)[:, t : t + 1],
        )


# ---------------------------------------------------------------- precomputed keys


@pytest.mark.parametrize("name", CASES)
def test_precomputed_keys_are_returned_not_stored(name):
    scorer, query_dim, key_dim = make(name)
    query, keys1, _ = inputs(2, 3, 5, query_dim, key_dim)
    keys2 = torch.randn_like(keys1)
    attributes = {id(m): set(vars(m)) for m in scorer.modules()}
    state = set(scorer.state_dict())

    pre1 = scorer.precompute_keys(keys1)
    energies1 = scorer.score(query, pre1)
    pre2 = scorer.precompute_keys(keys2)

    assert {id(m): set(vars(m)) for m in scorer.modules()} == attributes
    assert set(scorer.state_dict()) == state
    for module in scorer.modules():
        for value in vars(module).values():
            assert value is not pre1 and value is not pre2
    # score reads only the keys it is given: old keys still give the old energies
    if name not in KEY_INDEPENDENT:
        assert not torch.allclose(scorer.score(query, pre2), energies1)
    torch.testing.assert_close(scorer.score(query, pre1), energies1, rtol=0, atol=0)


@pytest.mark.parametrize("name", CASES)
def test_precomputed_keys_can_be_reordered_by_sentence(name):
    # Beam search reorders/repeats the precomputed keys with index_select(0, ...).
    scorer, query_dim, key_dim = make(name)
    query, keys, _ = inputs(2, 3, 5, query_dim, key_dim)
    index = torch.tensor([1, 0, 1, 1])
    selected = scorer.score(query[index], scorer.precompute_keys(keys).index_select(0, index))
    direct = scorer.score(query[index], scorer.precompute_keys(keys[index]))
    torch.testing.assert_close(selected, direct)


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize("name", CASES)
def test_every_parameter_gets_a_gradient(name):
    scorer, query_dim, key_dim = make(name)
    query, keys, mask = inputs(2, 3, 5, query_dim, key_dim, lengths=[5, 3])
    query.requires_grad_()
    keys.requires_grad_()
    attention = Attention(scorer)
    context, weights = attention(query, attention.precompute_keys(keys), keys, mask)
    ((context * torch.randn_like(context)).sum() + (weights**2).sum()).backward()
    for param_name, param in attention.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, param_name
    assert query.grad.abs().sum() > 0
    assert keys.grad.abs().sum() > 0


@pytest.mark.parametrize("name", CASES)
def test_gradcheck(name):
    scorer, query_dim, key_dim = make(name)
    query, keys, mask = inputs(2, 2, 3, query_dim, key_dim, lengths=[3, 2])
    values = torch.randn(2, 3, key_dim, dtype=torch.float64)
    attention = Attention(scorer)

    def attend(query, keys, values):
        return attention(query, attention.precompute_keys(keys), values, mask)

    tensors = tuple(t.requires_grad_() for t in (query, keys, values))
    assert torch.autograd.gradcheck(attend, tensors)


# ---------------------------------------------------------------- constructor options


@pytest.mark.parametrize("cls", [DotScorer, ScaledDotScorer])
def test_dot_size_mismatch_error_names_sizes_and_fix(cls):
    message = r"query_dim=6.*key_dim=4.*model\.attention\.project_keys=true"
    with pytest.raises(ValueError, match=message):
        cls(query_dim=6, key_dim=4)


@pytest.mark.parametrize("cls", [DotScorer, ScaledDotScorer])
def test_dot_project_keys(cls):
    scorer = cls(query_dim=6, key_dim=4, project_keys=True)
    assert scorer.key_proj.weight.shape == (6, 4) and scorer.key_proj.bias is None
    assert cls(query_dim=4, key_dim=4).key_proj is None  # no parameters unless asked
    keys = torch.randn(2, 5, 4)
    assert scorer.precompute_keys(keys).shape == (2, 5, 6)


def test_gaussian_weights_are_a_kernel_over_distances():
    # W_q = W_k = I, b = 0: the weights are the normalized kernel of ||q - k||.
    for kernel in GaussianScorer.KERNELS:
        scorer = GaussianScorer(query_dim=3, key_dim=3, kernel=kernel, sigma=2.0).double()
        with torch.no_grad():
            scorer.query_proj.weight.copy_(torch.eye(3))
            scorer.key_proj.weight.copy_(torch.eye(3))
            scorer.key_proj.bias.zero_()
        query, keys, _ = inputs(1, 2, 4, 3, 3)
        _, weights = Attention(scorer)(query, scorer.precompute_keys(keys), keys)
        dist_sq = torch.cdist(query, keys) ** 2  # (1, 2, 4)
        if kernel == "gaussian":
            kernel_values = torch.exp(-dist_sq / 8)
        else:
            kernel_values = (1 - dist_sq / 4).clamp(min=1e-6)
        torch.testing.assert_close(weights, kernel_values / kernel_values.sum(-1, keepdim=True))


def test_gaussian_options():
    scorer = GaussianScorer(query_dim=6, key_dim=4)
    assert scorer.query_proj.out_features == 6 and scorer.key_proj.in_features == 4
    assert math.exp(scorer.log_sigma.item()) == pytest.approx(math.sqrt(6))
    scorer = GaussianScorer(query_dim=6, key_dim=4, hidden_size=9, kernel="epanechnikov")
    assert math.exp(scorer.log_sigma.item()) == pytest.approx(6.0)
    assert GaussianScorer(query_dim=6, key_dim=4, sigma=0.5).log_sigma.requires_grad
    assert GaussianScorer(query_dim=6, key_dim=4, hidden_size=9).precompute_keys(
        torch.randn(2, 5, 4)).shape == (2, 5, 10)
    with pytest.raises(ValueError, match="kernel must be one of gaussian, epanechnikov"):
        GaussianScorer(query_dim=6, key_dim=4, kernel="box")
    with pytest.raises(ValueError, match="sigma must be positive"):
        GaussianScorer(query_dim=6, key_dim=4, sigma=0.0)


@pytest.mark.parametrize("kernel", GaussianScorer.KERNELS)
def test_gaussian_never_builds_a_4d_tensor(kernel):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    Largest.numel = max(Largest.numel, t.numel())
            return out

    B, T, S, A = 2, 7, 11, 13
    scorer = GaussianScorer(query_dim=5, key_dim=3, hidden_size=A, kernel=kernel)
    query, keys = torch.randn(B, T, 5), torch.randn(B, S, 3)
    with Largest():
        scorer.score(query, scorer.precompute_keys(keys))
    assert Largest.numel <= max(B * T * S, B * S * (A + 1), B * T * A)


def test_epanechnikov_floor_outside_the_window():
    # Every key far outside the bandwidth: the floor gives a uniform row, not 0/0.
    scorer = GaussianScorer(query_dim=2, key_dim=2, kernel="epanechnikov", sigma=0.1).double()
    query, keys, mask = inputs(1, 1, 3, 2, 2)
    _, weights = Attention(scorer)(query, scorer.precompute_keys(100 * keys), keys, mask)
    torch.testing.assert_close(weights, torch.full((1, 1, 3), 1 / 3, dtype=torch.float64))


@pytest.mark.parametrize("normalizer", ["softmax", "sparsemax"])
def test_location_source_longer_than_max_length(normalizer):
    scorer = LocationScorer(query_dim=4, key_dim=3, max_length=3).double()
    query, keys, mask = inputs(2, 2, 5, 4, 3, lengths=[5, 2])
    precomputed = scorer.precompute_keys(keys)
    assert precomputed.shape == (2, 5, 0)
    energies = scorer.score(query, precomputed)
    assert energies.shape == (2, 2, 5) and torch.all(energies[..., 3:] == float("-inf"))
    attention = Attention(scorer, normalizer=normalizer)
    context, weights = attention(query, precomputed, keys, mask)
    assert torch.all(weights[0, :, 3:] == 0) and torch.all(weights[1, :, 2:] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, dtype=torch.float64))
    short = attention(query[:1], precomputed[:1, :3], keys[:1, :3], mask[:1, :3])
    torch.testing.assert_close((context[:1], weights[:1, :, :3]), short)  # tail ignored
    with pytest.raises(ValueError, match="max_length must be >= 1"):
        LocationScorer(query_dim=4, key_dim=3, max_length=0)


def test_location_energies_ignore_the_keys():
    scorer = LocationScorer(query_dim=4, key_dim=3, max_length=6)
    query, keys = torch.randn(2, 3, 4), torch.randn(2, 5, 3)
    energies = scorer.score(query, scorer.precompute_keys(keys))
    torch.testing.assert_close(energies, scorer.position_proj(query)[..., :5])
    torch.testing.assert_close(scorer.score(query, scorer.precompute_keys(-keys)), energies)


def test_general_without_scale_is_unchanged_and_with_it_divides_by_sqrt_d():
    """scale=false (the default, and every config and checkpoint before the option) computes
    exactly what GeneralScorer computed before; scale=true divides those energies by sqrt(d)."""
    query, keys, _ = inputs(2, 3, 5, 9, 4)
    plain = GeneralScorer(query_dim=9, key_dim=4).double()
    default = GeneralScorer(query_dim=9, key_dim=4, scale=False).double()
    scaled = GeneralScorer(query_dim=9, key_dim=4, scale=True).double()
    # The option adds no parameter: one state dict loads into either (old checkpoints too).
    default.load_state_dict(plain.state_dict())
    scaled.load_state_dict(plain.state_dict())
    before = query @ (keys @ plain.key_proj.weight.T).transpose(1, 2)  # the formula until now
    energies = plain.score(query, plain.precompute_keys(keys))
    torch.testing.assert_close(energies, before, rtol=0, atol=0)
    torch.testing.assert_close(default.score(query, default.precompute_keys(keys)), energies,
                               rtol=0, atol=0)
    torch.testing.assert_close(scaled.score(query, scaled.precompute_keys(keys)), energies / 3.0)
    assert plain.scale is None and scaled.scale == 1 / 3


def test_scaled_dot_divides_by_dot_product_length():
    assert ScaledDotScorer(query_dim=6, key_dim=4, project_keys=True).scale == 1 / math.sqrt(6)


def test_additive_hidden_size_defaults_to_query_dim():
    assert AdditiveScorer(query_dim=6, key_dim=4).v.in_features == 6
    assert AdditiveScorer(query_dim=6, key_dim=4, hidden_size=3).v.in_features == 3


def test_multihead_options():
    scorer = MultiHeadScorer(query_dim=6, key_dim=8, heads=4, scorer=DotScorer)
    assert scorer.num_heads == 4
    assert scorer.head_dim == 2 and scorer.query_proj.out_features == 8
    with pytest.raises(ValueError, match=r"key_dim=5.*heads=2"):
        MultiHeadScorer(query_dim=6, key_dim=5, heads=2, scorer=DotScorer)
    with pytest.raises(ValueError, match="heads >= 1"):
        MultiHeadScorer(query_dim=6, key_dim=4, heads=0, scorer=DotScorer)


@pytest.mark.parametrize("inner", [AdditiveScorer, GeneralScorer, ScaledDotScorer])
def test_single_identity_head_is_the_inner_scorer(inner):
    scorer = MultiHeadScorer(query_dim=4, key_dim=4, heads=1, scorer=inner).double()
    with torch.no_grad():
        scorer.query_proj.weight.copy_(torch.eye(4))
        scorer.key_proj.weight.copy_(torch.eye(4))
    query, keys, mask = inputs(2, 3, 5, 4, 4, lengths=[5, 2])

    energies = scorer.score(query, scorer.precompute_keys(keys))
    inner_energies = scorer.inner.score(query, scorer.inner.precompute_keys(keys))
    torch.testing.assert_close(energies, inner_energies.unsqueeze(2))  # (B, T, 1, S)

    multi, single = Attention(scorer), Attention(scorer.inner)
    context, weights = multi(query, multi.precompute_keys(keys), keys, mask)
    ref_context, ref_weights = single(query, single.precompute_keys(keys), keys, mask)
    torch.testing.assert_close(context, ref_context)
    torch.testing.assert_close(weights, ref_weights)


def test_multihead_heads_read_their_own_value_slice():
    # Head 0 attends only to position 0, head 1 only to position 1 (energies of +-inf-ish size).
    class Fixed(nn.Module):
        num_heads = 2

        def precompute_keys(self, keys):
            return keys

        def score(self, query, keys):
            e = torch.full((1, 1, 2, 2), -1e4)
            e[0, 0, 0, 0] = e[0, 0, 1, 1] = 0.0
            return e

    values = torch.tensor([[[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]])  # (1, 2, 4)
    context, weights = Attention(Fixed())(torch.zeros(1, 1, 3), values, values)
    torch.testing.assert_close(context, torch.tensor([[[1.0, 2.0, 7.0, 8.0]]]))
    torch.testing.assert_close(weights, torch.tensor([[[0.5, 0.5]]]))  # averaged over heads


# ---------------------------------------------------------------- mixed precision


@pytest.mark.parametrize("normalizer", ["softmax", "sparsemax"])
@pytest.mark.parametrize(
    "name", ["additive", "general", "multihead_additive", "gaussian", "location"]
)
def test_autocast_bfloat16(name, normalizer):
    scorer, query_dim, key_dim = make(name)
    scorer.float()
    query, keys, mask = inputs(2, 3, 5, query_dim, key_dim, lengths=[5, 3])
    query, keys = query.float(), keys.float()
    attention = Attention(scorer, normalizer=normalizer)
    ref_context, ref_weights = attention(query, attention.precompute_keys(keys), keys, mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        context, weights = attention(query, attention.precompute_keys(keys), keys, mask)
    assert torch.all(weights[~mask[:, None, :].expand_as(weights)] == 0)
    torch.testing.assert_close(weights.float(), ref_weights, rtol=0, atol=3e-2)
    torch.testing.assert_close(context.float(), ref_context, rtol=0, atol=5e-2)


def test_half_precision_weights_follow_values_dtype():
    scorer, query_dim, key_dim = make("multihead_additive")
    query, keys, mask = inputs(2, 3, 5, query_dim, key_dim, lengths=[5, 3])
    attention = Attention(scorer.to(torch.bfloat16))
    query, keys = query.to(torch.bfloat16), keys.to(torch.bfloat16)
    context, weights = attention(query, attention.precompute_keys(keys), keys, mask)
    assert context.dtype == weights.dtype == torch.bfloat16
    assert torch.all(weights[~mask[:, None, :].expand_as(weights)] == 0)
    torch.testing.assert_close(weights.float().sum(-1), torch.ones(2, 3), rtol=0, atol=2e-2)


# ---------------------------------------------------------------- configs and user scorers


@pytest.mark.parametrize(
    "file,cls",
    [
        ("additive", AdditiveScorer),
        ("dot", DotScorer),
        ("scaled_dot", ScaledDotScorer),
        ("general", GeneralScorer),
        ("multihead", MultiHeadScorer),
        ("gaussian", GaussianScorer),
        ("location", LocationScorer),
    ],
)
def test_config_instantiates(file, cls):
    cfg = OmegaConf.load(ATTENTION_CONFIGS / f"{file}.yaml")
    assert "query_dim" not in cfg and "key_dim" not in cfg  # the builder passes them
    scorer_cfg, normalizer = split_attention_config(cfg)
    assert normalizer == "softmax"  # every YAML names it, softmax by default
    # The files name the scorers by registry name; the builder resolves them to the classes.
    scorer = instantiate(resolve_targets(scorer_cfg, SCORER, "model.attention"), query_dim=16,
                         key_dim=16)
    assert type(scorer) is cls
    query, keys, mask = torch.randn(2, 3, 16), torch.randn(2, 4, 16), torch.ones(2, 4, dtype=bool)
    attention = Attention(scorer, normalizer=normalizer)
    context, weights = attention(query, attention.precompute_keys(keys), keys, mask)
    assert context.shape == (2, 3, 16) and weights.shape == (2, 3, 4)
    if cls is MultiHeadScorer:
        assert scorer.num_heads == 4 and isinstance(scorer.inner, AdditiveScorer)
    if cls is GeneralScorer:
        assert scorer.scale is None  # Luong's unscaled q^T W k unless scale=true


def test_user_scorer_plugs_in_by_target():
    cfg = OmegaConf.create({"_target_": f"{CosineScorer.__module__}.CosineScorer", "scale": 5.0})
    scorer = instantiate(cfg, query_dim=6, key_dim=4)
    assert isinstance(scorer, CosineScorer) and scorer.scale == 5.0 and scorer.num_heads == 1


def test_docs_example_is_the_test_helper():
    section = DOCS_MODELS.read_text("utf-8").split("## Writing your own scorer", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    namespace = {}
    exec(code, namespace)
    query, keys, mask = inputs(2, 3, 5, 6, 4, lengths=[5, 2])
    outputs = []
    for cls in (namespace["CosineScorer"], CosineScorer):
        torch.manual_seed(1)
        attention = Attention(cls(query_dim=6, key_dim=4).double())
        outputs.append(attention(query, attention.precompute_keys(keys), keys, mask))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)


def test_additive_under_bf16_autocast_stays_close_to_fp32():
    torch.manual_seed(0)
    scorer = AdditiveScorer(query_dim=16, key_dim=8, hidden_size=32)
    query = torch.randn(3, 4, 16)
    keys = scorer.precompute_keys(torch.randn(3, 5, 8)).detach()
    with torch.no_grad():
        expected = scorer.score(query, keys)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        training = scorer.score(query, keys.bfloat16())
        with torch.no_grad():
            searching = scorer.score(query, keys.bfloat16())
    assert training.dtype == searching.dtype == torch.bfloat16
    scale = expected.abs().max()
    assert (training.float() - expected).abs().max() <= 0.05 * scale
    assert (searching.float() - expected).abs().max() <= 0.05 * scale
    training.float().sum().backward()
    assert scorer.query_proj.weight.grad is not None and scorer.v.weight.grad is not None
