"""An exponential moving average of the weights (``trainer.ema=DECAY``).

After the n-th optimizer step, ``average = d * average + (1 - d) * weights`` with
``d = min(decay, (1 + n) / (10 + n))`` (the first step copies the weights). The ramp is
TensorFlow's ``ExponentialMovingAverage(num_updates=...)``: without it, a decay of 0.999 would
still hold 61 % of the first step's (near random) weights at step 500, and every early
validation would score that. From about step 9 / (1 - decay) on (9,000 steps at 0.999) ``d``
is ``decay``, and the average spans about the last 1 / (1 - decay) steps: it smooths the noise
of the last steps as checkpoint averaging does, without waiting for checkpoints.

The average is what a run validates and keeps: its ``best.pt``, ``step*.pt`` and ``recent/``
hold averaged weights, while ``last.pt`` holds the weights being trained with the average
beside them (``ema``), so a resumed run continues both exactly. The averaging is PyTorch's
``torch.optim.swa_utils.AveragedModel`` (parameters and buffers, in the parameters' dtype),
given the ramped decay as its ``multi_avg_fn``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel

# The ramp's constants: d = min(decay, (1 + n) / (RAMP + n)).
RAMP = 10


def ramped_ema(decay: float):
    """``AveragedModel``'s ``multi_avg_fn``: the average moves ``1 - d`` of the way to the
    weights, ``d`` ramped up to ``decay`` by the updates made (``n``, after the first)."""
    def update(averaged: list[Tensor], current: list[Tensor], updates: Tensor) -> None:
        n = float(updates)
        rate = 1 - min(decay, (1 + n) / (RAMP + n))
        torch._foreach_lerp_(averaged, current, rate)  # as torch's get_ema_multi_avg_fn

    return update


class WeightAverage:
    """The exponential moving average of ``model``'s weights (the model being trained, copied
    once here, its weights read at each update), on the model's device; ``decay``, in (0, 1), is
    the weight of the average against the new weights at each step."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0 < decay < 1:
            raise ValueError(f"the average's decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.averaged = AveragedModel(model, multi_avg_fn=ramped_ema(decay), use_buffers=True)
        self.averaged.eval()  # it is validated, never trained: dropout stays off

    @property
    def model(self) -> nn.Module:
        """The averaged model: a copy of the trained one with the averaged weights."""
        return self.averaged.module

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Fold ``model``'s current weights into the average (after an optimizer step)."""
        self.averaged.update_parameters(model)

    def state_dict(self) -> dict[str, Any]:
        """Plain tensors and numbers: the averaged weights and the updates made."""
        return {"model": self.model.state_dict(), "updates": int(self.averaged.n_averaged),
                "decay": self.decay}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.averaged.n_averaged.fill_(int(state["updates"]))
