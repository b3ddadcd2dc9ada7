"""trainer.regularization_by_epochs (seq2seq.training.regularization): dropout and weight decay
chosen at the first validation from the epochs the budget will reach, kept for a resume."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from seq2seq.config_types import ConfigError
from seq2seq.training.regularization import (
    RegularizationChoice,
    apply_regularization,
    choose,
)
from seq2seq.training.run import train
from seq2seq.training.settings import TrainerSettings

LIGHT = "[{below_epochs:5,dropout:0.3,weight_decay:0.05}]"


@pytest.mark.parametrize(("entries", "message"), [
    ({"below_epochs": 5}, " must be a list"),
    ([{"dropout": 0.1}], r"\[0\]: below_epochs is missing"),
    ([{"below_epochs": 5}], r"\[0\]: give dropout, weight_decay or both"),
    ([{"below_epochs": 5, "dropout": 1.0}], r"\[0\].dropout must be in \[0, 1\)"),
    ([{"below_epochs": 5, "weight_decay": -0.1}], r"\[0\].weight_decay must be at least 0"),
    ([{"below_epochs": 5, "dropout": 0.1}, {"below_epochs": 5, "dropout": 0.2}],
     r"\[1\].below_epochs must be positive and above the entry before's"),
    ([{"below_epochs": 5, "droput": 0.1}], r"\[0\]: unknown settings droput"),
    ([{"below_epochs": "many", "dropout": 0.1}], r"\[0\].below_epochs: expected a number"),
])
def test_bad_entries_are_refused_naming_the_entry(entries, message):
    with pytest.raises(ConfigError, match=f"^trainer.regularization_by_epochs{message}"):
        TrainerSettings.from_dict({"regularization_by_epochs": entries})


def test_the_first_entry_above_the_projected_epochs_is_chosen():
    choices = TrainerSettings.from_dict({"regularization_by_epochs": [
        {"below_epochs": 10, "dropout": 0.1}, {"below_epochs": 22, "weight_decay": 0.01}],
    }).regularization_by_epochs
    assert choose(choices, 9.9) == RegularizationChoice(10, dropout=0.1)
    assert choose(choices, 10) == RegularizationChoice(22, weight_decay=0.01)
    assert choose(choices, 22) is None  # the config's own settings stay


def test_apply_sets_every_dropout_layer_and_the_weight_decay_only():
    """What model.dropout set at build time (dropout layers, a stacked RNN's dropout between
    layers), not a one-layer RNN's (torch warns on it) or anything else."""
    model = nn.Sequential(nn.Embedding(5, 4), nn.Dropout(0.1), nn.GRU(4, 4, num_layers=2,
                                                                       dropout=0.1),
                          nn.Sequential(nn.Dropout(0.1)), nn.LSTM(4, 4))
    optimizer = torch.optim.AdamW(model.parameters(), weight_decay=0.1)
    apply_regularization(model, optimizer, dropout=0.25, weight_decay=None)
    assert [m.p for m in model.modules() if isinstance(m, nn.Dropout)] == [0.25, 0.25]
    assert model[2].dropout == 0.25 and model[4].dropout == 0
    assert optimizer.param_groups[0]["weight_decay"] == 0.1
    apply_regularization(model, optimizer, dropout=None, weight_decay=0.01)
    assert optimizer.param_groups[0]["weight_decay"] == 0.01 and model[1].p == 0.25


def dropout_rates(model: nn.Module) -> frozenset[float]:
    return frozenset(m.p for m in model.modules() if isinstance(m, nn.Dropout))


def test_the_choice_is_made_at_the_first_validation_and_a_resume_goes_on_with_it(
        tiny_train_config, tmp_path, caplog, monkeypatch):
    """40 steps of 19 batches an epoch: 2.1 epochs, below 5, so from the first validation
    (step 10) dropout 0.3 and weight decay 0.05 instead of the config's 0.0 and 0.01. Stopped at
    20 and resumed to 40 equals 40 straight: the resumed run trains with the choice too."""
    from seq2seq.training import trainer as trainer_module

    seen = []
    real_step = trainer_module.Trainer._optimizer_step

    def recording_step(self, tokens):  # the settings each step trains with
        seen.append((self.state.step, dropout_rates(self.model),
                     self.optimizer.param_groups[0]["weight_decay"]))
        return real_step(self, tokens)

    monkeypatch.setattr(trainer_module.Trainer, "_optimizer_step", recording_step)
    common = {"trainer.regularization_by_epochs": LIGHT, "trainer.valid_every": 10,
              "trainer.save_every": 20, "trainer.valid.max_sentences": 4,
              "model.dropout": 0.0, "optimizer.weight_decay": 0.01}
    split, straight = tmp_path / "split", tmp_path / "straight"
    with caplog.at_level(logging.INFO, logger="seq2seq.training.trainer"):
        train(tiny_train_config(**common, **{"trainer.max_steps": 40}), straight)
    assert seen[9] == (9, {0.0}, 0.01) and seen[10] == (10, {0.3}, 0.05)  # from step 10 on
    assert {rates for _, rates, _ in seen[10:]} == {frozenset({0.3})}
    assert ("trainer.regularization_by_epochs: the budget will reach 2.1 epochs at this pace "
            "(step 10), below 5: dropout 0.3 and weight decay 0.05 from here on") in caplog.text
    last = torch.load(straight / "checkpoints" / "last.pt", weights_only=True)
    assert last["trainer_state"]["regularization"] == pytest.approx(
        {"step": 10, "epochs": 40 / 19, "dropout": 0.3, "weight_decay": 0.05})

    train(tiny_train_config(**common, **{"trainer.max_steps": 20}), split)
    seen.clear()
    train(tiny_train_config(**common, **{"trainer.max_steps": 40, "trainer.resume": "auto"}),
          split)
    assert {rates for _, rates, _ in seen} == {frozenset({0.3})}
    assert {decay for _, _, decay in seen} == {0.05}
    resumed = torch.load(split / "checkpoints" / "last.pt", weights_only=True)
    # Chosen before the stop (with 20 steps to go: 1.05 epochs), kept by the resumed run.
    assert resumed["trainer_state"]["regularization"] == pytest.approx(
        {"step": 10, "epochs": 20 / 19, "dropout": 0.3, "weight_decay": 0.05})
    for name, tensor in last["model"].items():
        assert torch.equal(resumed["model"][name], tensor), f"{name} differs after resume"


def test_no_entry_above_the_epochs_keeps_the_config_and_records_it(tiny_train_config, tmp_path,
                                                                    caplog):
    with caplog.at_level(logging.INFO, logger="seq2seq.training.trainer"):
        train(tiny_train_config(**{"trainer.regularization_by_epochs": "[{below_epochs:1,dropout:0.3}]",
                                   "trainer.max_steps": 20, "trainer.valid_every": 10,
                                   "trainer.valid.max_sentences": 4}), tmp_path)
    assert ("the budget will reach 1.1 epochs at this pace (step 10): no entry's below_epochs "
            "is above that, model.dropout and optimizer.weight_decay stay as set") in caplog.text
    state = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["trainer_state"]
    assert state["regularization"]["dropout"] is None and state["regularization"]["step"] == 10
