"""Export: a trained model as a folder another runtime decodes (ONNX Runtime, CTranslate2,
Argos Translate, Hugging Face ``transformers``), through one entry point."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

# Each format's writer (module, function): it takes the model, its tokenizers, its run config,
# the output folder and the format's own keyword options. Imported when used: a format's
# packages are an extra of their own.
WRITERS = {"onnx": ("seq2seq.export.onnx_export", "export_model"),
           "ctranslate2": ("seq2seq.export.ctranslate2_export", "convert_model"),
           "argos": ("seq2seq.export.argos", "package_model"),
           "huggingface": ("seq2seq.export.huggingface", "convert_model")}
# What every writer is given besides the format's own options.
COMMON = ("model", "tokenizers", "config", "output", "trainer_state", "source")


def export_checkpoint(checkpoint: str | Path, output: str | Path, *, format: str = "onnx",
                      **options: Any) -> dict[str, Any]:
    """Export a checkpoint file to the folder ``output`` in ``format`` (a :data:`WRITERS`
    key); returns the manifest written. ``options`` are the format's writer's (``quantize``,
    ``overwrite``; ``opset`` for onnx; the languages, ``package_version`` and ``sbd_model``
    for argos); the trainer summary and the checkpoint's path go into the manifest.

    Raises:
        CheckpointError: on a missing, corrupted or unsafe checkpoint.
        ExportError: see the writer. An unknown format or option, a bad ``quantize`` or an
            existing output is refused before the checkpoint is read.
    """
    from seq2seq.checkpoint import load_checkpoint, model_from_checkpoint
    from seq2seq.export.folder import ExportError, check_export_options

    if format not in WRITERS:
        raise ExportError(f"format must be one of {', '.join(WRITERS)}, got {format!r}")
    module, function = WRITERS[format]
    writer = getattr(importlib.import_module(module), function)
    own = set(inspect.signature(writer).parameters) - set(COMMON)
    unknown = sorted(set(options) - own)
    if unknown:
        raise ExportError(f"format={format} takes no option {', '.join(unknown)}")
    check_export_options(output, quantize=options.get("quantize", "none"),
                         overwrite=options.get("overwrite", False))
    payload = load_checkpoint(checkpoint)
    model, tokenizers, config = model_from_checkpoint(payload, "cpu")
    return writer(model, tokenizers, config, output, trainer_state=payload.get("trainer_state"),
                  source=str(checkpoint), **options)
