"""Checkpoint averaging: the mean of the last few checkpoints of a run is usually a slightly
better and steadier model than any one of them.

* :func:`average_checkpoints` averages checkpoint files (``seq2seq-average``) of one model
  (:func:`check_compatible`). The result keeps the first checkpoint's config and tokenizers,
  drops the training state (:data:`TRAINING_ONLY`), lists its sources under ``averaged_from``,
  and loads like any other checkpoint. Floating-point entries are averaged in float64 and
  stored in their original dtype; integer entries are taken from the first checkpoint.
* :func:`average_recent` (``trainer.average_last=N``): when training ends (a resumed run too),
  the models of the last N validations, kept in ``checkpoints/recent/``, are averaged into
  ``checkpoints/averaged.pt`` and validated (translations in ``validation/averaged.hyp``). Its
  BLEU is logged next to best.pt's, written to TensorBoard (``valid/averaged_bleu``), kept in
  the trainer state and, through :func:`summary`, in the numbers ``train()`` returns. Only
  rank 0 reads, writes and validates; the other ranks wait for its BLEU in a broadcast.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from seq2seq.checkpoint import CheckpointError, load_checkpoint
from seq2seq.config_types import error_reason
from seq2seq.training.state import TrainerState

if TYPE_CHECKING:  # annotations only: not worth loading TensorBoard or the inference stack
    from torch.utils.tensorboard import SummaryWriter

    from seq2seq.training.distributed import DistributedContext
    from seq2seq.training.validation import Validator

log = logging.getLogger(__name__)

AVERAGED = "averaged.pt"  # the averaged model's file in a run's checkpoints/
NOT_AVERAGED = -1.0  # what rank 0 broadcasts when there is no averaged model

# Entries only the training loop uses: an averaged model has no optimizer history.
TRAINING_ONLY = ("optimizer", "schedule", "scaler", "trainer_state", "sampler", "rng", "ema")


def check_compatible(first: dict, other: dict, first_name: str, other_name: str) -> None:
    """Raise :class:`CheckpointError` at the first difference in parameters or tokenizers."""
    first_model, other_model = first["model"], other["model"]
    if first_model.keys() != other_model.keys():
        missing = sorted(first_model.keys() - other_model.keys())
        extra = sorted(other_model.keys() - first_model.keys())
        raise CheckpointError(
            f"{other_name} has different parameters than {first_name} "
            f"(missing: {missing[:3]}, unexpected: {extra[:3]})"
        )
    for name, tensor in first_model.items():
        other_tensor = other_model[name]
        if tensor.shape != other_tensor.shape:
            raise CheckpointError(
                f"cannot average: {name} has shape {tuple(other_tensor.shape)} in "
                f"{other_name} but {tuple(tensor.shape)} in {first_name}"
            )
        if tensor.is_floating_point() != other_tensor.is_floating_point():
            raise CheckpointError(
                f"cannot average: {name} is {other_tensor.dtype} in {other_name} but "
                f"{tensor.dtype} in {first_name}"
            )
    first_tokenizers, other_tokenizers = first.get("tokenizers", {}), other.get("tokenizers", {})
    same_tokenizers = first_tokenizers.keys() == other_tokenizers.keys() and all(
        torch.equal(first_tokenizers[key], other_tokenizers[key])
        if isinstance(first_tokenizers[key], torch.Tensor)
        else first_tokenizers[key] == other_tokenizers[key]
        for key in first_tokenizers
    )
    if not same_tokenizers:
        raise CheckpointError(
            f"cannot average: {other_name} and {first_name} use different tokenizers"
        )


def _average(named_payloads: Iterable[tuple[str, dict]]) -> dict[str, Any]:
    """Average ``(name, payload)`` pairs, consuming them one at a time (a generator that loads
    each file when asked keeps at most two checkpoints in memory besides the sums)."""
    first = first_name = sums = None
    names: list[str] = []
    for name, payload in named_payloads:
        names.append(name)
        if first is None:
            first, first_name = payload, name
            sums = {
                key: tensor.double() if tensor.is_floating_point() else tensor.clone()
                for key, tensor in payload["model"].items()
            }
            continue
        check_compatible(first, payload, first_name, name)
        for key, tensor in payload["model"].items():
            if tensor.is_floating_point():
                sums[key] += tensor.double()
    if first is None:
        raise CheckpointError("no checkpoints to average")
    averaged = {
        key: (total / len(names)).to(first["model"][key].dtype)
        if first["model"][key].is_floating_point()
        else total
        for key, total in sums.items()
    }
    result = {key: value for key, value in first.items() if key not in TRAINING_ONLY}
    result["model"] = averaged
    result["averaged_from"] = names
    return result


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, Any]:
    """The averaged checkpoint payload of the files ``paths`` (``averaged_from``: the paths).

    Raises:
        CheckpointError: on an unreadable checkpoint or parameters that do not match.
    """
    return _average((str(path), load_checkpoint(path)) for path in paths)


# -- at the end of a run (trainer.average_last) ----------------------------------------------
def average_recent(state: TrainerState, checkpoints, *, model: nn.Module, validator: Validator,
                   context: DistributedContext, writer: SummaryWriter | None = None) -> None:
    """Average, validate and report the kept checkpoints (nothing without average_last).

    The kept checkpoints' names and best.pt's BLEU are read from ``state``, and the averaged
    model's BLEU and sources recorded there. ``checkpoints``: the run's
    :class:`~seq2seq.training.checkpoint_manager.CheckpointManager` (not annotated: that module
    imports this one). ``model`` stays unchanged (a copy is loaded with the average); the
    ``validator`` writes the translations to ``averaged.hyp`` in its folder. Rank 0 alone
    averages and validates, on ``context.device``.
    """
    if not checkpoints.average_last:
        return
    if context.is_main:
        bleu = _average_and_validate(state, checkpoints, model, validator, context.device,
                                     writer)
    else:
        bleu = NOT_AVERAGED
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


def _average_and_validate(state: TrainerState, checkpoints, model: nn.Module,
                          validator: Validator, device: torch.device,
                          writer: SummaryWriter | None) -> float:
    """Rank 0's part: the averaged model's BLEU, or NOT_AVERAGED (skipped, or it failed)."""
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
            log.error("could not average the last checkpoints: %s", error_reason(error))
            return NOT_AVERAGED
        averaged = copy.deepcopy(model).eval()
        averaged.load_state_dict(payload["model"])
        hyp_path = validator.output_dir / "averaged.hyp" if validator.output_dir else None
        scores, hypotheses, _ = validator.evaluate(averaged, device, hyp_path)
        del averaged
        bleu = scores["bleu"]
        state.averaged_from = names
        log.info("validation of %s: loss %.3f ppl %.2f BLEU %.2f chrF %.2f (%d sentences, %.1fs) "
                 "-> %s", checkpoints.averaged_path, scores["loss"], scores["ppl"], bleu,
                 scores["chrf"], len(hypotheses), scores["seconds"], hyp_path)
    state.averaged_bleu = bleu
    line = (f"averaged last {len(names)}: BLEU {bleu:.2f} vs best.pt {state.best_bleu:.2f} "
            f"(step {state.best_step}); the better is {better_checkpoint(state)}")
    log.info("%s", line)
    if writer is not None:
        writer.add_scalar("valid/averaged_bleu", bleu, state.step)
        writer.add_text("valid/averaged", line, state.step)
        writer.flush()
    return bleu
