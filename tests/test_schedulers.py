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
from seq2seq.training.trainer import TrainerSettings


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


def test_plateau_halves_after_patience_and_resumes_exactly():
    schedule = PlateauSchedule(factor=0.5, patience=1, min_factor=0.2)
    for bleu in (10, 12, 11, 11.5):  # two validations without a better BLEU than 12
        schedule.on_validation(bleu)
    assert schedule.factor(1000) == 0.5
    restored = PlateauSchedule(factor=0.5, patience=1, min_factor=0.2)
    restored.load_state_dict(schedule.state_dict())
    for bleu in (11, 11):
        schedule.on_validation(bleu)
        restored.on_validation(bleu)
    assert restored.factor(1000) == schedule.factor(1000) == 0.25
    for _ in range(10):
        schedule.on_validation(0)
    assert schedule.factor(1000) == 0.2  # never below min_factor
    assert not math.isinf(schedule.state_dict()["best"])


def test_trainer_settings_need_a_stopping_criterion():
    with pytest.raises(ValueError, match="training never ends"):
        TrainerSettings.from_dict({"max_epochs": None, "max_steps": None, "max_time": None})
    with pytest.raises(ValueError, match="unknown trainer settings"):
        TrainerSettings.from_dict({"max_epoch": 3})
