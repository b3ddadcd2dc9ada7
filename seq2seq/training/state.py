"""The trainer's own progress, and the random states an exact resume needs."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field, fields

import numpy as np
import torch


@dataclass
class TrainerState:
    """Everything about training progress that is not a model, optimizer or sampler.

    It is saved in every checkpoint as a plain dict, so a resumed run continues exactly.
    """

    step: int = 0  # optimizer steps taken
    epoch: int = 0  # the epoch in progress (0-based)
    batches_in_epoch: int = 0  # batches of this epoch already consumed (incl. accumulation)
    tokens_seen: int = 0  # target tokens trained on
    train_seconds: float = 0.0  # wall time spent training (not validating), across resumes
    best_bleu: float = -1.0
    best_step: int = 0
    validations_without_improvement: int = 0
    last_validated_step: int = -1  # so a resumed run does not validate the same step twice
    nonfinite_in_row: int = 0
    nonfinite_total: int = 0
    # [bleu, step, file name] of the best checkpoints kept, best first.
    best_checkpoints: list = field(default_factory=list)
    # trainer.average_last: the kept models of the last validations, oldest first, as paths
    # relative to checkpoints/ ("recent/stepNNNNNNN.pt").
    recent_checkpoints: list = field(default_factory=list)
    # The validation BLEU of checkpoints/averaged.pt and what it averages (same paths).
    averaged_bleu: float | None = None
    averaged_from: list = field(default_factory=list)
    # trainer.regularization_by_epochs, once chosen: {"step", "epochs" (projected), "dropout",
    # "weight_decay"} (None where the config's setting stayed).
    regularization: dict | None = None

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        names = {f.name for f in fields(self)}
        unknown = set(state) - names
        if unknown:
            raise ValueError(f"unknown trainer state entries: {sorted(unknown)}")
        for name, value in state.items():
            setattr(self, name, value)


def capture_rng_state() -> dict:
    """Python, numpy and torch (CPU and CUDA) random states as plain containers/tensors."""
    python_version, python_state, python_gauss = random.getstate()
    numpy_state = np.random.get_state()
    state = {
        "python": [python_version, list(python_state), python_gauss],
        "numpy": {
            "keys": torch.from_numpy(numpy_state[1].astype(np.int64)),
            "pos": int(numpy_state[2]),
            "has_gauss": int(numpy_state[3]),
            "cached_gaussian": float(numpy_state[4]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    version, python_state, gauss = state["python"]
    random.setstate((version, tuple(python_state), gauss))
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            "MT19937",
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
