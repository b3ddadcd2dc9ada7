"""What every export format shares: its one-line error, the checks of its options, the
checkpoint read for it and the folder written beside its destination and renamed into place
(whole or absent). The manifest's common entries are :mod:`seq2seq.export.manifest`'s job."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from seq2seq.atomic import default_permissions, fsync_directory
from seq2seq.checkpoint import load_checkpoint, model_from_checkpoint
from seq2seq.inference.export_format import MANIFEST_NAME, QUANTIZE_MODES


class ExportError(Exception):
    """A model that cannot be exported, or an export that cannot be written; one line."""


def check_export_options(output: str | Path, *, quantize: str, overwrite: bool) -> None:
    """Refuse an unknown ``quantize`` or an existing ``output`` (without ``overwrite``) before
    any work is done.

    Raises:
        ExportError: naming the option.
    """
    if quantize not in QUANTIZE_MODES:
        raise ExportError(f"quantize must be one of {', '.join(QUANTIZE_MODES)}, got {quantize!r}")
    output = Path(output)
    if output.exists() and not overwrite:
        raise ExportError(f"{output} already exists: give overwrite=true to replace it, or "
                          "another output")
    if output.exists() and not (output.is_dir() and (
            (output / MANIFEST_NAME).is_file() or not any(output.iterdir()))):
        raise ExportError(f"{output} is not an exported model (no {MANIFEST_NAME}): "
                          "overwrite=true replaces only an earlier export")


def publish(staging: Path, output: Path, *, overwrite: bool) -> None:
    """Rename ``staging`` to ``output``; an earlier export there is moved aside first and
    removed only once the new one is in place."""
    check_export_options(output, quantize="none", overwrite=overwrite)  # it may have appeared
    old = None
    if output.exists():
        old = staging.with_name(f"{staging.name}.old")
        output.rename(old)
    try:
        staging.rename(output)
    except BaseException:
        if old is not None:
            old.rename(output)
        raise
    fsync_directory(output.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def staged_folder(output: Path, *, overwrite: bool) -> Iterator[Path]:
    """A new folder beside ``output`` to write an export into: renamed to ``output`` when the
    block ends, removed when it raises."""
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent))
    try:
        yield staging
        default_permissions(staging, directory=True)
        publish(staging, output, overwrite=overwrite)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def load_for_export(checkpoint: str | Path) -> tuple[Any, Any, dict[str, Any], dict | None]:
    """The model (on the CPU), tokenizers, run config and trainer summary of a checkpoint file.

    Raises:
        CheckpointError: on a missing, corrupted or unsafe checkpoint.
    """
    payload = load_checkpoint(checkpoint)
    model, tokenizers, config = model_from_checkpoint(payload, "cpu")
    return model, tokenizers, config, payload.get("trainer_state")
