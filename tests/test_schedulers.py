"""Learning-rate schedules: warmup, decay shapes, plateau reaction and exact state round trip."""

from __future__ import annotations

import math

import pytest

from seq2seq.training.schedulers import (
    ConstantSchedule,
    CosineSchedule,
    InverseSqrtSchedule,
    PlateauSchedule,
)
from seq2seq.training.settings import TrainerSettings


def test_linear_warmup_then_constant():
    schedule = ConstantSchedule(warmup_steps=4)
    assert [schedule.factor(step) for step in (1, 2, 4, 100)] == [0.25, 0.5, 1.0, 1.0]


def test_inverse_sqrt_decays_after_warmup():
    schedule = InverseSqrtSchedule(warmup_steps=100)
    assert schedule.factor(50) == pytest.approx(0.5)
    assert schedule.factor(100) == pytest.approx(1.0)
    assert schedule.factor(400) == pytest.approx(0.5)


def test_cosine_reaches_min_factor_at_total_steps():
    schedule = CosineSchedule(warmup_steps=10, total_steps=110, min_factor=0.1)
    assert schedule.factor(10) == pytest.approx(1.0)
    assert schedule.factor(60) == pytest.approx(0.55)
    assert schedule.factor(110) == pytest.approx(0.1)
    assert schedule.factor(500) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="total_steps"):
        CosineSchedule(total_steps=None).factor(1)


def test_cosine_without_total_steps_follows_the_budget_progress():
    schedule = CosineSchedule(warmup_steps=10, min_factor=0.1)
    assert schedule.factor(5, progress=0.0) == pytest.approx(0.5)  # warmup still counts steps
    assert schedule.factor(500, progress=0.5) == pytest.approx(0.55)
    assert schedule.factor(900, progress=1.0) == pytest.approx(0.1)
    assert schedule.factor(901, progress=1.2) == pytest.approx(0.1)
    # total_steps, when given, wins over the progress the trainer passes
    assert CosineSchedule(total_steps=100).factor(50, progress=0.9) == pytest.approx(0.5)


@pytest.mark.parametrize("patience", [1, 2, 3])
def test_plateau_reduces_at_the_patience_th_validation_in_a_row_without_a_better_bleu(patience):
    """"patience" as in trainer.early_stopping_patience: act once bad_validations >= patience."""
    schedule = PlateauSchedule(factor=0.5, patience=patience)
    schedule.on_validation(20)  # the best
    for bad in range(1, patience):
        schedule.on_validation(20 - bad)  # not better (a tie is not better either)
        assert schedule.factor(1000) == 1.0, f"reduced after {bad} of {patience}"
    schedule.on_validation(20)
    assert schedule.factor(1000) == 0.5
    for _ in range(patience - 1):  # the count starts again after a reduction
        schedule.on_validation(5)
    assert schedule.factor(1000) == 0.5
    schedule.on_validation(5)
    assert schedule.factor(1000) == 0.25


def test_plateau_count_restarts_after_a_better_bleu():
    schedule = PlateauSchedule(factor=0.5, patience=2)
    for bleu in (10, 9, 11, 10.5, 12, 11):  # never two in a row without a better BLEU
        schedule.on_validation(bleu)
    assert schedule.factor(1000) == 1.0
    schedule.on_validation(11.5)
    assert schedule.factor(1000) == 0.5


def test_plateau_resumes_exactly_and_stops_at_min_factor():
    schedule = PlateauSchedule(factor=0.5, patience=2, min_factor=0.2)
    for bleu in (10, 12, 11, 11.5):  # two validations in a row without a better BLEU than 12
        schedule.on_validation(bleu)
    assert schedule.factor(1000) == 0.5
    schedule.on_validation(11)  # one of the two the next reduction needs
    restored = PlateauSchedule(factor=0.5, patience=2, min_factor=0.2)
    restored.load_state_dict(schedule.state_dict())
    assert restored.factor(1000) == 0.5
    for bleu in (11.9, 13):  # the second bad one reduces; then a better BLEU
        schedule.on_validation(bleu)
        restored.on_validation(bleu)
        assert restored.factor(1000) == schedule.factor(1000)
    assert schedule.factor(1000) == 0.25
    restored.on_validation(12.5)  # 13 is remembered as the best
    schedule.on_validation(12.5)
    assert restored.state_dict() == schedule.state_dict()
    for _ in range(10):
        schedule.on_validation(0)
    assert schedule.factor(1000) == 0.2  # never below min_factor
    assert not math.isinf(schedule.state_dict()["best"])


@pytest.mark.parametrize(("option", "value"), [("factor", 1.0), ("factor", 0.0), ("patience", 0)])
def test_plateau_rejects_options_that_make_no_sense(option, value):
    with pytest.raises(ValueError, match=f"scheduler.{option}"):
        PlateauSchedule(**{option: value})


def test_trainer_settings_need_a_stopping_criterion():
    with pytest.raises(ValueError, match="training never ends"):
        TrainerSettings.from_dict({"max_epochs": None, "max_steps": None, "max_time": None})
    with pytest.raises(ValueError, match="unknown.*max_epoch"):
        TrainerSettings.from_dict({"max_epoch": 3})
