"""Average the parameters of several checkpoints of one model into a new checkpoint.

    python scripts/average_checkpoints.py runs/x/checkpoints/step*.pt --output runs/x/checkpoints/avg.pt

Averaging the last few checkpoints of a run usually gives a slightly better and more stable
model than any one of them. The checkpoints must come from the same model: the same
parameter names and shapes and the same tokenizers, or the script refuses with a message
naming the first difference. The output keeps the first checkpoint's config and tokenizers,
drops the training state (optimizer, schedule, RNG, ...), lists its sources under
``averaged_from``, and loads like any other checkpoint (``evaluate.py``, ``translate.py``).

Floating-point entries are averaged in float64 and stored in their original dtype; integer
entries (none in the standard models) are taken from the first checkpoint.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from seq2seq.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

# Entries only the training loop uses: an averaged model has no optimizer history.
TRAINING_ONLY = ("optimizer", "schedule", "scaler", "trainer_state", "sampler", "rng")


def _check_compatible(first: dict, other: dict, first_path: Path, other_path: Path) -> None:
    """Raise CheckpointError at the first difference in parameters or tokenizers."""
    first_model, other_model = first["model"], other["model"]
    if first_model.keys() != other_model.keys():
        missing = sorted(first_model.keys() - other_model.keys())
        extra = sorted(other_model.keys() - first_model.keys())
        raise CheckpointError(
            f"{other_path} has different parameters than {first_path} "
            f"(missing: {missing[:3]}, unexpected: {extra[:3]})"
        )
    for name, tensor in first_model.items():
        if tensor.shape != other_model[name].shape:
            raise CheckpointError(
                f"cannot average: {name} has shape {tuple(other_model[name].shape)} in "
                f"{other_path} but {tuple(tensor.shape)} in {first_path}"
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
            f"cannot average: {other_path} and {first_path} use different tokenizers"
        )


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, Any]:
    """The averaged checkpoint payload of ``paths`` (see the module docstring).

    Raises:
        CheckpointError: on an unreadable checkpoint or parameters that do not match.
    """
    if not paths:
        raise CheckpointError("no checkpoints to average")
    paths = [Path(p) for p in paths]
    first = load_checkpoint(paths[0])
    sums = {
        name: tensor.double() if tensor.is_floating_point() else tensor.clone()
        for name, tensor in first["model"].items()
    }
    for path in paths[1:]:
        other = load_checkpoint(path)
        _check_compatible(first, other, paths[0], path)
        for name, tensor in other["model"].items():
            if tensor.is_floating_point():
                sums[name] += tensor.double()
    averaged = {
        name: (total / len(paths)).to(first["model"][name].dtype)
        if first["model"][name].is_floating_point()
        else total
        for name, total in sums.items()
    }
    payload = {key: value for key, value in first.items() if key not in TRAINING_ONLY}
    payload["model"] = averaged
    payload["averaged_from"] = [str(p) for p in paths]
    return payload


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+", help="checkpoint files of one model")
    parser.add_argument("--output", required=True, help="where to write the averaged checkpoint")
    args = parser.parse_args(argv)
    try:
        payload = average_checkpoints(args.checkpoints)
        save_checkpoint(payload, args.output)
    except CheckpointError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"error: cannot write {args.output}: {error.strerror or error}", file=sys.stderr)
        return 1
    print(f"averaged {len(args.checkpoints)} checkpoints into {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
