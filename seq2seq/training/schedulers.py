"""Learning-rate schedules as a factor on the optimizer's configured learning rate.

A schedule is a small stateful object: ``factor(step, progress=...)`` gives the multiplier for
optimizer step ``step`` (1-based), ``on_validation(bleu)`` lets it react to validation results,
and ``state_dict()`` holds plain numbers, so it resumes exactly. The trainer sets
``lr = base_lr * factor(step, progress=p)`` before every optimizer step, where ``p`` is the
fraction of the training budget spent (``trainer.max_time`` minutes of training or
``trainer.max_steps``, whichever is nearer its end; None when the run has neither), so a decay
can end exactly when a time-budgeted run does.
"""

from __future__ import annotations

import math


class Schedule:
    """Constant factor 1 after a linear warmup of ``warmup_steps`` steps."""

    def __init__(self, *, warmup_steps: int = 0) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.warmup_steps = warmup_steps

    def warmup(self, step: int) -> float:
        if self.warmup_steps and step < self.warmup_steps:
            return step / self.warmup_steps
        return 1.0

    def decay(self, step: int, progress: float | None = None) -> float:
        return 1.0

    def factor(self, step: int, *, progress: float | None = None) -> float:
        return self.warmup(step) * self.decay(step, progress)

    def on_validation(self, bleu: float) -> None:
        """Called with the validation BLEU after each validation."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class ConstantSchedule(Schedule):
    """lr stays at the optimizer's value (after warmup)."""


class InverseSqrtSchedule(Schedule):
    """lr * sqrt(warmup_steps / step) after warmup (Vaswani et al., 2017)."""

    def decay(self, step: int, progress: float | None = None) -> float:
        return math.sqrt(max(self.warmup_steps, 1) / max(step, self.warmup_steps, 1))


class CosineSchedule(Schedule):
    """Cosine decay from lr to ``min_factor * lr`` between warmup and ``total_steps``.

    Without ``total_steps`` the decay follows the trainer's budget ``progress`` instead (the
    fraction of ``trainer.max_time`` spent), so a run limited by minutes ends at ``min_factor``.
    """

    def __init__(
        self, *, warmup_steps: int = 0, total_steps: int | None = None, min_factor: float = 0.0
    ) -> None:
        super().__init__(warmup_steps=warmup_steps)
        self.total_steps = total_steps
        self.min_factor = min_factor

    def decay(self, step: int, progress: float | None = None) -> float:
        if self.total_steps:
            span = max(self.total_steps - self.warmup_steps, 1)
            progress = max(step - self.warmup_steps, 0) / span
        elif progress is None:
            raise ValueError("scheduler=cosine needs scheduler.total_steps, trainer.max_steps "
                             "or trainer.max_time")
        progress = min(max(progress, 0.0), 1.0)
        return self.min_factor + (1 - self.min_factor) * 0.5 * (1 + math.cos(math.pi * progress))


class PlateauSchedule(Schedule):
    """Multiply lr by ``factor`` after ``patience`` validations in a row without a better BLEU.

    "Patience" means the same here as in ``trainer.early_stopping_patience``: the action comes
    with the ``patience``-th validation in a row that did not beat the best BLEU.
    """

    def __init__(
        self,
        *,
        warmup_steps: int = 0,
        factor: float = 0.5,
        patience: int = 3,
        min_factor: float = 0.0,
    ) -> None:
        super().__init__(warmup_steps=warmup_steps)
        if not 0 < factor < 1:
            raise ValueError(f"scheduler.factor must be in (0, 1), got {factor}")
        if patience < 1:
            raise ValueError(f"scheduler.patience must be at least 1, got {patience}")
        self.reduction = factor
        self.patience = patience
        self.min_factor = min_factor
        self.scale = 1.0
        self.best = -math.inf
        self.bad_validations = 0

    def decay(self, step: int, progress: float | None = None) -> float:
        return self.scale

    def on_validation(self, bleu: float) -> None:
        if bleu > self.best:
            self.best, self.bad_validations = bleu, 0
            return
        self.bad_validations += 1
        if self.bad_validations >= self.patience:
            self.scale = max(self.scale * self.reduction, self.min_factor)
            self.bad_validations = 0

    def state_dict(self) -> dict:
        return {"scale": self.scale, "best": self.best, "bad_validations": self.bad_validations}

    def load_state_dict(self, state: dict) -> None:
        self.scale = float(state["scale"])
        self.best = float(state["best"])
        self.bad_validations = int(state["bad_validations"])
