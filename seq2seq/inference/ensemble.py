"""Ensemble decoding: several models of one vocabulary searched as one.

``Ensemble([model_a, model_b])`` is a :class:`~seq2seq.models.interfaces.DecodingModel` like
its members, so every search runs on it unchanged. Its next-token scores are the **mean of the
members' log-probabilities** (the search's ``log_softmax`` then renormalises them: a normalised
geometric mean, as in OpenNMT-py), its attention weights the mean of the members' weights.
Members may differ in anything but their source and target pieces, which they read and score
id by id (:func:`check_same_vocabularies`); docs/evaluate-translate.md ("Ensembles") says more.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from seq2seq.models.interfaces import PRECISIONS, DecodingModel, State


class EnsembleEncoded(tuple):
    """One encoded source per member, reordered (and cast) together."""

    def index_select(self, index: Tensor) -> EnsembleEncoded:
        return EnsembleEncoded(encoded.index_select(index) for encoded in self)

    def cast_memory(self, dtype: torch.dtype) -> EnsembleEncoded:
        return EnsembleEncoded(encoded.cast_memory(dtype) for encoded in self)


class Ensemble(DecodingModel):
    """Several models decoded as one (the module docstring), able to do what every member can.

    Args:
        models: the members (PyTorch models, exported ones), on one device, with the same
            vocabularies.
    """

    def __init__(self, models: Sequence[DecodingModel]) -> None:
        if not models:
            raise ValueError("an ensemble needs at least one model")
        self.members = list(models)
        self.precisions = tuple(p for p in PRECISIONS
                                if all(p in model.precisions for model in self.members))
        self.cpu_only = any(model.cpu_only for model in self.members)
        self.quantize = ("int8" if all(model.quantize == "int8" for model in self.members)
                         else "none")

    @property
    def training(self) -> bool:
        return any(model.training for model in self.members)

    def train(self, mode: bool = True) -> Ensemble:
        for model in self.members:
            model.train(mode)
        return self

    def eval(self) -> Ensemble:
        return self.train(False)

    @property
    def parameter_count(self) -> int:
        return sum(model.parameter_count for model in self.members)

    def encode(self, src: Tensor, src_lengths: Tensor) -> EnsembleEncoded:
        return EnsembleEncoded(model.encode(src, src_lengths) for model in self.members)

    def init_state(self, encoded: EnsembleEncoded) -> State:
        # One flat dict ("0.hidden", "1.hidden", ...) so select_state reorders every member.
        state = {}
        for number, (model, member_encoded) in enumerate(zip(self.members, encoded, strict=True)):
            for name, value in model.init_state(member_encoded).items():
                state[f"{number}.{name}"] = value
        return state

    def decode_step(
        self, prev_tokens: Tensor, state: State, encoded: EnsembleEncoded, *,
        output_ids: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, State]:
        """Mean log-probabilities (B, V) (or (B, K) over ``output_ids``: each member
        renormalised over them), mean attention weights (B, S) and the new state."""
        log_prob_sum: Tensor | None = None
        weight_sum: Tensor | None = None
        new_state = {}
        for number, (model, member_encoded) in enumerate(zip(self.members, encoded, strict=True)):
            prefix = f"{number}."
            member_state = {
                name[len(prefix):]: value for name, value in state.items()
                if name.startswith(prefix)
            }
            logits, weights, member_state = model.decode_step(
                prev_tokens, member_state, member_encoded, output_ids=output_ids
            )
            log_probs = torch.log_softmax(logits.float(), dim=-1)  # (B, V)
            log_prob_sum = log_probs if log_prob_sum is None else log_prob_sum + log_probs
            weights = weights.float()  # (B, S)
            weight_sum = weights if weight_sum is None else weight_sum + weights
            new_state.update({prefix + name: value for name, value in member_state.items()})
        count = len(self.members)
        return log_prob_sum / count, weight_sum / count, new_state


def vocabulary_difference(first, other) -> str | None:
    """How two :class:`~seq2seq.data.tokenizer.Tokenizers` differ in their pieces, or None."""
    for side in ("src", "tgt"):
        a, b = getattr(first, side), getattr(other, side)
        pieces_a = a.pieces(range(a.vocab_size))
        pieces_b = b.pieces(range(b.vocab_size))
        if pieces_a != pieces_b:
            name = "source" if side == "src" else "target"
            details = []
            if len(pieces_a) != len(pieces_b):
                details.append(f"{len(pieces_a)} vs {len(pieces_b)} pieces")
            # None where one list is the start of the other: the sizes say it all.
            index = next((i for i, (x, y) in enumerate(zip(pieces_a, pieces_b, strict=False))
                          if x != y), None)
            if index is not None:
                details.append(f"first difference at id {index}: {pieces_a[index]!r} vs "
                               f"{pieces_b[index]!r}")
            return f"their {name} vocabularies differ ({'; '.join(details)})"
    return None


def check_same_vocabularies(tokenizers: Sequence, names: Sequence[str]) -> None:
    """Raise ValueError naming the first member whose vocabularies (its
    :class:`~seq2seq.data.tokenizer.Tokenizers` in ``tokenizers``) differ from the first's;
    ``names`` are what the message calls the members (e.g. their checkpoint paths)."""
    for other, name in zip(tokenizers[1:], names[1:], strict=True):
        difference = vocabulary_difference(tokenizers[0], other)
        if difference is not None:
            raise ValueError(
                f"cannot ensemble {names[0]} and {name}: {difference}; an ensemble's models "
                "must share the sentencepiece vocabularies"
            )

