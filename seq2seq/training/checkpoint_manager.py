"""The checkpoint manager of a run: what is written to ``RUN/checkpoints/`` and what is kept.

* ``last.pt``: everything an exact resume needs, rewritten every ``save_every`` steps and at
  the end;
* ``best.pt``: the model with the best validation BLEU so far (no optimizer state);
* ``stepNNNNNNN-bleuXX.XX.pt``: the ``keep_best`` best models by validation BLEU; one that
  falls out of the best ``keep_best`` is deleted;
* with ``average_last=N``: ``recent/stepNNNNNNN.pt``, the models of the last N validations
  (older ones are deleted), and at the end of training ``averaged.pt``, their average
  (:meth:`CheckpointManager.write_average`, validated by :mod:`seq2seq.training.averaging`).

Every file is written atomically (:func:`seq2seq.checkpoint.save_checkpoint`), so a run killed
at any moment leaves the previous file intact. Which files exist is recorded in the trainer
state (``best_checkpoints``, ``recent_checkpoints``), so a resumed run goes on deleting the
right ones.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from seq2seq.checkpoint import save_checkpoint
from seq2seq.training.averaging import AVERAGED, average_checkpoints
from seq2seq.training.state import TrainerState

RECENT = "recent"  # the folder of the last validations' models, inside checkpoints/


class CheckpointManager:
    """Writes a run's checkpoints to ``directory`` (the run's ``checkpoints/``) and decides which
    to keep: the ``keep_best`` best by BLEU besides ``best.pt`` (0: none) and the models of the
    last ``average_last`` validations, for averaging (None: none). Only rank 0 is ``enabled``: it
    alone writes files."""

    def __init__(self, *, directory: Path, keep_best: int, average_last: int | None = None,
                 enabled: bool = True) -> None:
        self.directory = Path(directory)
        self.keep_best = keep_best
        self.average_last = average_last
        self.enabled = enabled
        if enabled:
            self._remove_stale_temporaries()

    def _remove_stale_temporaries(self) -> None:
        """Delete what a killed run left mid-write (``.NAME.XXXX.tmp``); its targets are intact."""
        for folder in (self.directory, self.directory / RECENT):
            for stale in folder.glob(".*.pt.*.tmp"):
                stale.unlink(missing_ok=True)

    @property
    def last_path(self) -> Path:
        return self.directory / "last.pt"

    @property
    def averaged_path(self) -> Path:
        return self.directory / AVERAGED

    def save_last(self, payload: dict) -> None:
        if self.enabled:
            save_checkpoint(payload, self.last_path)

    def record_validation(
        self, state: TrainerState, bleu: float, model_payload: Callable[[], dict]
    ) -> None:
        """Update the best score in ``state`` (its best BLEU, patience count and kept files) and
        the files after a validation at ``state.step``; ``model_payload`` builds the checkpoint
        of the current model, called at most once, only when a file is written."""
        improved = bleu > state.best_bleu
        if improved:
            state.best_bleu, state.best_step = bleu, state.step
            state.validations_without_improvement = 0
        else:
            state.validations_without_improvement += 1
        if not self.enabled:
            return
        payload = functools.cache(model_payload)
        if improved:
            save_checkpoint(payload(), self.directory / "best.pt")
        if self.keep_best > 0:
            self._keep_best(state, bleu, payload)
        if self.average_last:
            self._keep_recent(state, payload)

    def _keep_best(self, state: TrainerState, bleu: float, payload: Callable[[], dict]) -> None:
        ranked = sorted(state.best_checkpoints + [[bleu, state.step, None]], key=lambda r: -r[0])
        kept, dropped = ranked[: self.keep_best], ranked[self.keep_best :]
        for entry in kept:
            if entry[2] is None:
                entry[2] = f"step{state.step:07d}-bleu{bleu:.2f}.pt"
                save_checkpoint(payload(), self.directory / entry[2])
        for entry in dropped:
            if entry[2] is not None:
                (self.directory / entry[2]).unlink(missing_ok=True)
        state.best_checkpoints = kept

    def _keep_recent(self, state: TrainerState, payload: Callable[[], dict]) -> None:
        """Keep this validation's model in ``recent/``, and only the last ``average_last``."""
        name = f"{RECENT}/step{state.step:07d}.pt"
        save_checkpoint(payload(), self.directory / name)
        recent = [entry for entry in state.recent_checkpoints if entry != name] + [name]
        state.recent_checkpoints = recent[-self.average_last :]
        # Every other file goes, also those a killed run wrote after the last.pt this run
        # resumed from (which its trainer state does not list).
        for path in (self.directory / RECENT).glob("step*.pt"):
            if f"{RECENT}/{path.name}" not in state.recent_checkpoints:
                path.unlink(missing_ok=True)

    def write_average(self, names: list[str]) -> dict:
        """Average the checkpoints ``names`` (relative to the folder) into ``averaged.pt``;
        returns the averaged payload, whose ``averaged_from`` lists ``names``.

        Raises:
            CheckpointError: a checkpoint that cannot be read or does not match the others.
            OSError: ``averaged.pt`` cannot be written.
        """
        payload = average_checkpoints([self.directory / name for name in names])
        payload["averaged_from"] = list(names)
        if self.enabled:
            save_checkpoint(payload, self.averaged_path)
        return payload
