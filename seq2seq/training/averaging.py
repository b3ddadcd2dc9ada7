"""``trainer.average_last=N``: at the end of training, average the last N validations' models.

The :class:`~seq2seq.training.checkpointing.CheckpointManager` keeps the model of each of the
last N validations in ``checkpoints/recent/``. When training ends (a resumed run too),
:func:`average_recent` averages them into ``checkpoints/averaged.pt`` and validates it with the
run's :class:`~seq2seq.training.validation.Validator` (the data, settings and scoring of every
validation; translations in ``validation/averaged.hyp``). Its BLEU is logged next to best.pt's
(``averaged last N: BLEU x vs best.pt y``), written to TensorBoard (``valid/averaged_bleu``),
kept in the trainer state (``averaged_bleu``, ``averaged_from``) and, through :func:`summary`,
in the numbers ``train()`` returns (``averaged_bleu``, ``better_checkpoint``).

Only rank 0 reads, writes and validates; the other ranks wait for its BLEU in a broadcast, as
they do at every validation.
"""

from __future__ import annotations

import copy
import logging
from typing import TYPE_CHECKING

from seq2seq.checkpoint import CheckpointError
from seq2seq.training.checkpointing import AVERAGED
from seq2seq.training.state import TrainerState

if TYPE_CHECKING:
    from seq2seq.training.trainer import Trainer

log = logging.getLogger(__name__)

NOT_AVERAGED = -1.0  # what rank 0 broadcasts when there is no averaged model


def average_recent(trainer: Trainer) -> None:
    """Average, validate and report the kept checkpoints (nothing without average_last)."""
    state, context = trainer.state, trainer.context
    if not trainer.checkpoints.average_last:
        return
    bleu = _average_and_validate(trainer) if context.is_main else NOT_AVERAGED
    bleu = context.broadcast(bleu)  # the other ranks wait here while rank 0 validates
    if bleu == NOT_AVERAGED:
        state.averaged_bleu, state.averaged_from = None, []
    else:
        state.averaged_bleu = bleu


def better_checkpoint(state: TrainerState) -> str:
    """``averaged.pt`` when its BLEU beats best.pt's, else ``best.pt``."""
    averaged = state.averaged_bleu
    return AVERAGED if averaged is not None and averaged > state.best_bleu else "best.pt"


def summary(state: TrainerState) -> dict:
    """``averaged_bleu`` and ``better_checkpoint`` (a path inside the run folder), or {}."""
    if state.averaged_bleu is None:
        return {}
    return {"averaged_bleu": state.averaged_bleu,
            "better_checkpoint": f"checkpoints/{better_checkpoint(state)}"}


def _average_and_validate(trainer: Trainer) -> float:
    """Rank 0's part: the averaged model's BLEU, or NOT_AVERAGED (skipped, or it failed)."""
    checkpoints, state = trainer.checkpoints, trainer.state
    names = [name for name in state.recent_checkpoints if (checkpoints.directory / name).is_file()]
    missing = [name for name in state.recent_checkpoints if name not in names]
    if missing:
        log.warning("checkpoint averaging: %s missing, averaging the others", ", ".join(missing))
    if len(names) < 2:
        log.info("trainer.average_last=%d: %d validation checkpoint(s) kept, nothing to average "
                 "(it takes at least 2)", checkpoints.average_last, len(names))
        return NOT_AVERAGED
    if (names == state.averaged_from and state.averaged_bleu is not None
            and checkpoints.averaged_path.is_file()):  # a resumed run that had already ended
        bleu = state.averaged_bleu
        log.info("%s already averages %s: BLEU %.2f", checkpoints.averaged_path, ", ".join(names),
                 bleu)
    else:
        try:
            payload = checkpoints.write_average(names)
        except (CheckpointError, OSError) as error:
            log.error("could not average the last checkpoints: %s", str(error).splitlines()[0])
            return NOT_AVERAGED
        model = copy.deepcopy(trainer.model).eval()
        model.load_state_dict(payload["model"])
        validator = trainer.validator
        hyp_path = validator.output_dir / "averaged.hyp" if validator.output_dir else None
        scores, hypotheses, _ = validator.evaluate(model, trainer.device, hyp_path)
        del model
        bleu = scores["bleu"]
        state.averaged_from = names
        log.info("validation of %s: loss %.3f ppl %.2f BLEU %.2f chrF %.2f (%d sentences, %.1fs) "
                 "-> %s", checkpoints.averaged_path, scores["loss"], scores["ppl"], bleu,
                 scores["chrf"], len(hypotheses), scores["seconds"], hyp_path)
    state.averaged_bleu = bleu
    line = (f"averaged last {len(names)}: BLEU {bleu:.2f} vs best.pt {state.best_bleu:.2f} "
            f"(step {state.best_step}); the better is {better_checkpoint(state)}")
    log.info("%s", line)
    if trainer.writer is not None:
        trainer.writer.add_scalar("valid/averaged_bleu", bleu, state.step)
        trainer.writer.add_text("valid/averaged", line, state.step)
        trainer.writer.flush()
    return bleu
