"""Average the parameters of several checkpoints of one model into one checkpoint payload.

Averaging the last few checkpoints of a run usually gives a slightly better and more stable
model than any one of them. ``scripts/average_checkpoints.py`` runs :func:`average_checkpoints`
on files; ``trainer.average_last=N`` (:mod:`seq2seq.training.averaging`) runs it on the models
of a run's last N validations at the end of training.

The checkpoints must come from the same model: the same parameter names and shapes and the
same tokenizers, or :class:`~seq2seq.checkpoint.CheckpointError` names the first difference.
The result keeps the first checkpoint's config and tokenizers, drops the training state
(optimizer, schedule, RNG, ...), lists its sources under ``averaged_from``, and loads like any
other checkpoint (``evaluate.py``, ``translate.py``).

Floating-point entries are averaged in float64 and stored in their original dtype; integer
entries (none in the standard models) are taken from the first checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from seq2seq.checkpoint import CheckpointError, load_checkpoint

# Entries only the training loop uses: an averaged model has no optimizer history.
TRAINING_ONLY = ("optimizer", "schedule", "scaler", "trainer_state", "sampler", "rng")


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


def average_payloads(payloads: Sequence[dict], names: Sequence[str] | None = None) -> dict:
    """The averaged checkpoint payload of checkpoints already in memory.

    Args:
        payloads: checkpoint dicts (as :func:`~seq2seq.checkpoint.load_checkpoint` returns).
        names: what error messages and ``averaged_from`` call them (default: ``checkpoint 1``,
            ``checkpoint 2``, ...).

    Raises:
        CheckpointError: on no payloads or parameters/tokenizers that do not match.
    """
    if names is None:
        names = [f"checkpoint {index + 1}" for index in range(len(payloads))]
    if len(names) != len(payloads):
        raise ValueError(f"{len(payloads)} payloads but {len(names)} names")
    return _average(zip(names, payloads, strict=True))


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, Any]:
    """The averaged checkpoint payload of the files ``paths`` (``averaged_from``: the paths).

    Raises:
        CheckpointError: on an unreadable checkpoint or parameters that do not match.
    """
    return _average((str(path), load_checkpoint(path)) for path in paths)
