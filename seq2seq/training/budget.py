"""The training budget: ``max_steps``, ``max_epochs`` and ``max_time``, read on rank 0's clock.

Every rank must stop at the same step and set the same learning rate, so the elapsed training
time is rank 0's, broadcast; the fraction of the budget spent (what ``scheduler=cosine`` decays
over when it has no step count) is computed from that same number on every rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from seq2seq.training.settings import TrainerSettings
from seq2seq.training.state import TrainerState


def training_over(state: TrainerState, settings: TrainerSettings,
                  seconds_trained: float | None = None) -> bool:
    """Whether a run at ``state`` has nothing left to train: a limit of ``max_steps``,
    ``max_epochs`` or ``max_time`` is reached, or early stopping stopped it.

    ``seconds_trained``: the training seconds to hold against ``max_time`` (None: the state's
    own). The trainer passes rank 0's clock, so that every rank gives the same answer.
    A resumed run checks this before its first step; ``compare.py`` reads it from a run's
    ``last.pt`` to tell a finished run from one cut off.
    """
    seconds = state.train_seconds if seconds_trained is None else seconds_trained
    patience = settings.early_stopping_patience
    return ((settings.max_steps is not None and state.step >= settings.max_steps)
            or (settings.max_epochs is not None and state.epoch >= settings.max_epochs)
            or (settings.max_time is not None and seconds >= settings.max_time * 60)
            or (patience is not None and state.validations_without_improvement >= patience))


class TrainingBudget:
    """How much of a run's budget is spent: ``max_steps``, ``max_epochs`` and ``max_time``
    (minutes of training, validation not counted; None: not set) against this rank's
    ``batches_per_epoch``; ``broadcast`` sends rank 0's float to every rank (identity on a single
    process)."""

    def __init__(
        self,
        *,
        max_steps: int | None,
        max_epochs: int | None,
        max_time: float | None,
        batches_per_epoch: int,
        broadcast: Callable[[float], float],
    ) -> None:
        self.max_steps = max_steps
        self.max_epochs = max_epochs
        self.max_time = max_time
        self.batches_per_epoch = max(batches_per_epoch, 1)
        self._broadcast = broadcast
        self.seconds_trained = 0.0  # rank 0's training seconds at the last clock read

    def start(self, state: TrainerState) -> None:
        """A run (or a resumed one) begins with the seconds it had already trained."""
        self.seconds_trained = self._broadcast(state.train_seconds)

    def time_is_up(self, state: TrainerState, started: float) -> bool:
        """Whether ``max_time`` is spent; ``started`` is when the current stretch began."""
        if self.max_time is None:
            return False
        self.seconds_trained = self._broadcast(state.train_seconds + time.perf_counter() - started)
        return self.seconds_trained >= self.max_time * 60

    def progress(self, state: TrainerState) -> float | None:
        """The fraction spent of each limit that is set, the largest (None when none is set)."""
        fractions = []
        if self.max_steps:
            fractions.append(state.step / self.max_steps)
        if self.max_epochs:
            fractions.append((state.epoch + state.batches_in_epoch / self.batches_per_epoch)
                             / self.max_epochs)
        if self.max_time:
            fractions.append(self.seconds_trained / (self.max_time * 60))
        return max(fractions) if fractions else None

    def epochs_at_end(self, state: TrainerState) -> float | None:
        """The epochs the run will have trained when its budget ends, at its pace so far
        (None before the first step, or with no limit set)."""
        progress = self.progress(state)
        if not progress:
            return None
        return (state.epoch + state.batches_in_epoch / self.batches_per_epoch) / progress
