"""The training budget: the fraction spent and max_time on rank 0's broadcast clock."""

import time

import pytest

from seq2seq.training.budget import TrainingBudget, training_over
from seq2seq.training.settings import TrainerSettings
from seq2seq.training.state import TrainerState


def make_budget(**limits):
    settings = {"max_steps": None, "max_epochs": None, "max_time": None} | limits
    return TrainingBudget(**settings, batches_per_epoch=10, broadcast=lambda value: value)


def test_no_limit_gives_no_progress_and_never_runs_out():
    budget = make_budget()
    state = TrainerState()
    assert budget.progress(state) is None
    assert not budget.time_is_up(state, time.perf_counter())


def test_progress_is_the_largest_fraction_spent():
    budget = make_budget(max_steps=100, max_epochs=4)
    state = TrainerState()
    state.step, state.epoch, state.batches_in_epoch = 30, 1, 5  # 30% of steps, 1.5/4 epochs
    assert budget.progress(state) == pytest.approx(0.375)


def test_time_budget_counts_earlier_seconds_and_uses_the_broadcast_clock():
    seen = []
    budget = TrainingBudget(max_steps=None, max_epochs=None, max_time=1.0, batches_per_epoch=1,
                            broadcast=lambda value: seen.append(value) or 45.0)
    state = TrainerState()
    state.train_seconds = 10.0
    budget.start(state)
    assert budget.progress(state) == pytest.approx(0.75)  # rank 0's 45 s, not this rank's 10
    assert not budget.time_is_up(state, time.perf_counter())
    assert seen[-1] >= 10.0  # this rank offered its own seconds, earlier ones included
    late = TrainingBudget(max_steps=None, max_epochs=None, max_time=1.0, batches_per_epoch=1,
                          broadcast=lambda value: value)
    state.train_seconds = 61.0
    assert late.time_is_up(state, time.perf_counter())
    assert late.progress(state) >= 1.0


@pytest.mark.parametrize(("limits", "progress", "over"), [
    ({"max_steps": 10}, {"step": 9}, False),
    ({"max_steps": 10}, {"step": 10}, True),
    ({"max_epochs": 2}, {"epoch": 2}, True),
    ({"max_time": 1.0}, {"train_seconds": 59.0}, False),
    ({"max_time": 1.0}, {"train_seconds": 60.0}, True),
    ({"max_steps": 10, "early_stopping_patience": 2}, {"validations_without_improvement": 2},
     True),
    ({"max_steps": 10, "early_stopping_patience": 2}, {"validations_without_improvement": 1},
     False),
])
def test_training_over(limits, progress, over):
    settings = TrainerSettings(**{"max_epochs": None} | limits)
    state = TrainerState(**progress)
    assert training_over(state, settings) is over


def test_training_over_holds_the_given_clock_against_max_time():
    settings = TrainerSettings(max_epochs=None, max_time=1.0)
    state = TrainerState(train_seconds=10.0)  # this rank's clock
    assert training_over(state, settings, seconds_trained=61.0)  # rank 0's
    assert not training_over(TrainerState(train_seconds=61.0), settings, seconds_trained=10.0)


def test_epochs_at_end_projects_the_pace_so_far_to_the_first_limit():
    """A quarter of a 60-minute budget spent in 1.5 epochs: 6 epochs at the end, unless a
    step limit comes first; nothing to project before the first step."""
    budget = TrainingBudget(max_steps=None, max_epochs=None, max_time=60.0, batches_per_epoch=10,
                            broadcast=lambda value: 900.0)  # rank 0's clock: 15 minutes
    state = TrainerState()
    assert budget.epochs_at_end(state) is None
    budget.start(state)
    state.step, state.epoch, state.batches_in_epoch = 15, 1, 5
    assert budget.epochs_at_end(state) == pytest.approx(6.0)
    budget.max_steps = 20  # 75 % of the steps done: they end it first, at 2 epochs
    assert budget.epochs_at_end(state) == pytest.approx(2.0)
