"""What the weights say: decode with every attention weight replaced, and see what BLEU loses.

The probes, ``uniform`` and ``shifted``, and what their scores say: docs/compare.md, "What
`compare.py` does" ("What the weights say"). The probed model is a copy: the modules that
normalise energies into weights are replaced by subclasses that override
:meth:`~seq2seq.models.attention.Attention.normalize`, so the scorer, the context and everything
else are the model's own.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from seq2seq.models.attention import Attention
from seq2seq.models.transformer import MultiHeadAttention, TransformerDecoder
from seq2seq.study import markdown

PROBES = ("uniform", "shifted")


def check_probe(probe: str) -> str:
    if probe not in PROBES:
        raise ValueError(f"probe must be one of {', '.join(PROBES)}, got {probe!r}")
    return probe


def uniform_weights(real: Tensor) -> Tensor:
    """1/S on each of a row's S real positions (True in ``real``), 0 elsewhere.

    Shape:
        - real: (*, S) bool
        - output: (*, S) float32
    """
    real = real.float()
    return real / real.sum(dim=-1, keepdim=True)


def shifted_weights(weights: Tensor, real: Tensor) -> Tensor:
    """Move each row's weights half its real length along, cyclically over its real positions.

    Real positions are a prefix of each row (padding comes last), as the encoders make them.

    Shape:
        - weights: (*, S)
        - real: (*, S) bool
        - output: (*, S), 0 at padding
    """
    length = real.sum(dim=-1, keepdim=True).clamp(min=1)  # (*, 1)
    positions = torch.arange(weights.size(-1), device=weights.device)  # (S,)
    # Output position j takes the weight of source position (j - S // 2) mod S.
    source = (positions - length // 2) % length  # (*, S)
    return weights.gather(-1, source.expand_as(weights)) * real


def probe_weights(probe: str, energies: Tensor, weights: Tensor) -> Tensor:
    """The probe's replacement for ``weights``, computed from them and ``energies``.

    The positions a row can attend to are those with finite energies (padding is -inf; so is
    whatever a scorer rules out, e.g. the location scorer past its ``max_length``).

    Shape:
        - energies, weights, output: (*, S)
    """
    real = torch.isfinite(energies)
    if probe == "uniform":
        return uniform_weights(real).to(weights.dtype)
    return shifted_weights(weights, real)


class _Probed:
    """Mixed in before an attention module: its ``normalize``'s weights replaced by those of
    ``probe``, one of :data:`PROBES` (the other arguments go to the attention module)."""

    def __init__(self, *args, probe: str = "uniform", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.probe = check_probe(probe)

    def normalize(self, energies: Tensor) -> Tensor:
        return probe_weights(self.probe, energies, super().normalize(energies))


class ProbedAttention(_Probed, Attention):
    """:class:`Attention` whose weights are replaced by a probe's (RNN decoders)."""


class ProbedCrossAttention(_Probed, MultiHeadAttention):
    """A Transformer layer's cross-attention whose weights are replaced by a probe's."""

    def forward(self, *args, **kwargs):
        kwargs["need_weights"] = True  # the fused kernel cannot take other weights
        return super().forward(*args, **kwargs)


def _probed_cross_attention(attention: MultiHeadAttention, probe: str) -> ProbedCrossAttention:
    """``attention``'s weights in a :class:`ProbedCrossAttention`."""
    weight = attention.query_proj.weight
    # The constructor's random init is overwritten at once: leave the global RNG as it was.
    with torch.random.fork_rng(devices=[]):
        probed = ProbedCrossAttention(d_model=attention.query_proj.in_features,
                                      num_heads=attention.num_heads,
                                      key_dim=attention.key_proj.in_features,
                                      dropout=attention.dropout, probe=probe)
    probed.load_state_dict(attention.state_dict())
    return probed.to(weight.device, weight.dtype)


def has_attention(model: nn.Module) -> bool:
    """Whether :func:`probed_model` finds attention to replace in ``model``."""
    decoder = getattr(model, "decoder", None)
    return isinstance(decoder, TransformerDecoder) or \
        isinstance(getattr(decoder, "attention", None), Attention)


def probed_model(model: nn.Module, probe: str) -> nn.Module:
    """A copy of a :class:`~seq2seq.models.seq2seq.Seq2Seq` that decodes with the probe's weights.

    Raises:
        ValueError: on an unknown probe, or a model with no attention to replace.
    """
    check_probe(probe)
    if not has_attention(model):
        name = type(getattr(model, "decoder", model)).__name__
        raise ValueError(f"no attention to probe in {name}")
    probed = copy.deepcopy(model)
    decoder = probed.decoder
    if isinstance(decoder, TransformerDecoder):
        for layer in decoder.layers:
            layer.cross_attention = _probed_cross_attention(layer.cross_attention, probe)
    else:
        decoder.attention = ProbedAttention(decoder.attention.scorer,
                                            decoder.attention.normalizer, probe=probe)
    return probed


# -- the report ------------------------------------------------------------------------------
def group_summary(label: str, per_run: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """A group's mean BLEU and, per probe, its mean BLEU and the BLEU drop (mean and sample
    standard deviation over seeds); None when no run was probed."""
    runs = [r for r in per_run if r.get("faithfulness")]
    if not runs:
        return None
    row: dict[str, Any] = {"group": label, "runs": len(runs),
                           "bleu": statistics.fmean(r["bleu"] for r in runs)}
    for probe in PROBES:
        drops = [r["bleu"] - r["faithfulness"][probe]["bleu"] for r in runs]
        row[probe] = {"bleu": statistics.fmean(r["faithfulness"][probe]["bleu"] for r in runs),
                      "drop": statistics.fmean(drops),
                      "drop_std": statistics.stdev(drops) if len(drops) > 1 else None}
    return row


def markdown_section(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The report's section: BLEU with the model's weights and with each probe's."""
    if not rows:
        return []

    def change(entry: Mapping[str, Any]) -> str:
        spread = "" if entry["drop_std"] is None else f" ± {entry['drop_std']:.2f}"
        return f"{entry['bleu']:.2f} ({-entry['drop']:+.2f}{spread})"

    return markdown.section(
        "What the weights say",
        "BLEU decoded with each step's attention weights replaced: `uniform` gives every real "
        "source piece the same weight; `shifted` moves the model's own weights half the "
        "sentence along. Change: mean ± sample standard deviation over seeds of the BLEU "
        "gained (lost when negative). A small loss says the output does not depend on where "
        "the weights point, so the weights do not explain it; a large one that it does, which "
        "an explanation needs but does not prove.",
        ["group", "runs", "BLEU", *(f"{probe} weights: BLEU (change)" for probe in PROBES)],
        ([row["group"], str(row["runs"]), f"{row['bleu']:.2f}",
          *(change(row[probe]) for probe in PROBES)] for row in rows))
