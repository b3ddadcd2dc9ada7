"""Regularization chosen from the epochs a run will reach: ``trainer.regularization_by_epochs``.

How much dropout and weight decay a small corpus needs depends on how many epochs a run makes:
an hour that reaches 14 to 19 epochs (the AVX2 EPYC) ends still learning and did better with
lighter regularization, one that reaches 25 to 27 (the Intel Xeon) over-fits without the
heavier (docs/results.md). A preset cannot know which machine it runs on, and the CPU's name
does not say its speed, so the run measures it: at its first validation it projects the
epochs its budget will reach at the pace so far (:meth:`TrainingBudget.epochs_at_end`) and
takes the first entry whose ``below_epochs`` is above them. The choice is kept in the trainer
state, so a resumed run goes on with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from seq2seq.config_types import ConfigError, settings_from_dict

KEY = "trainer.regularization_by_epochs"


@dataclass(frozen=True)
class RegularizationChoice:
    """One entry: below this many projected epochs, this dropout and weight decay (None:
    the one the config sets)."""

    below_epochs: float
    dropout: float | None = None
    weight_decay: float | None = None


def choices_from_config(entries: Sequence) -> list[RegularizationChoice]:
    """The entries of ``trainer.regularization_by_epochs``, checked.

    Raises:
        ConfigError: an entry of another shape, a bound that is not positive or not above the
            one before, a dropout outside [0, 1), a negative weight decay.
    """
    if not isinstance(entries, (list, tuple)):
        raise ConfigError(f"{KEY} must be a list of {{below_epochs, dropout, weight_decay}}, "
                          f"got {entries!r}")
    choices = []
    for index, entry in enumerate(entries):
        key = f"{KEY}[{index}]"
        if isinstance(entry, dict) and "below_epochs" not in entry:
            raise ConfigError(f"{key}: below_epochs is missing")
        choice = settings_from_dict(RegularizationChoice, entry, key)
        if choice.below_epochs <= (choices[-1].below_epochs if choices else 0):
            raise ConfigError(f"{key}.below_epochs must be positive and above the entry "
                              f"before's, got {choice.below_epochs}")
        if choice.dropout is None and choice.weight_decay is None:
            raise ConfigError(f"{key}: give dropout, weight_decay or both")
        if choice.dropout is not None and not 0 <= choice.dropout < 1:
            raise ConfigError(f"{key}.dropout must be in [0, 1), got {choice.dropout}")
        if choice.weight_decay is not None and choice.weight_decay < 0:
            raise ConfigError(f"{key}.weight_decay must be at least 0, got {choice.weight_decay}")
        choices.append(choice)
    return choices


def choose(choices: Sequence[RegularizationChoice], epochs: float) -> RegularizationChoice | None:
    """The first entry whose bound is above ``epochs``; None: the config's settings stay."""
    return next((choice for choice in choices if epochs < choice.below_epochs), None)


def apply_regularization(model: nn.Module, optimizer: torch.optim.Optimizer, *,
                         dropout: float | None, weight_decay: float | None) -> None:
    """Set what ``model.dropout`` set at build time (every dropout layer, and the dropout
    between a stacked RNN's layers; not ``attention_dropout``) and every parameter group's
    weight decay; None leaves one as it is."""
    if dropout is not None:
        for module in model.modules():
            if isinstance(module, nn.Dropout):
                module.p = dropout
            elif isinstance(module, nn.RNNBase) and module.num_layers > 1:
                module.dropout = dropout
    if weight_decay is not None:
        for group in optimizer.param_groups:
            group["weight_decay"] = weight_decay
