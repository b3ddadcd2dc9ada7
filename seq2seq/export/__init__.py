"""Export: a trained model as a folder another runtime decodes (ONNX Runtime, CTranslate2,
Argos Translate, Hugging Face ``transformers``, a web page), through one entry point and one registry of
formats (:data:`FORMATS`), which ``seq2seq-export`` reads. Torch-free: the writers are imported
when used, a format's packages being an extra of their own."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seq2seq.inference.export_format import MANIFEST_NAME, check_quantize_mode


class ExportError(Exception):
    """A model that cannot be exported, or an export that cannot be written; one line."""


@dataclass(frozen=True)
class ExportFormat:
    """One format ``seq2seq-export`` writes: its ``writer`` (``module:function``, which takes the
    model, its tokenizers, its run config and the output folder, then ``overwrite``,
    ``trainer_state``, ``source`` and its ``options`` as keywords, and returns the manifest
    written), its own keyword ``options`` (``quantize``, ``opset``, ...), the ``packages`` it
    imports (all in the extra ``extra``), what it refuses that another format does (``limits``,
    said when an option is refused) and what to do with the folder written (``usage``, logged;
    ``{output}``: its path)."""

    writer: str
    options: tuple[str, ...]
    packages: tuple[str, ...]
    extra: str = "export"
    limits: str = ""
    usage: str = "decode it with translate.py checkpoint={output}"


FORMATS = {
    "onnx": ExportFormat("seq2seq.export.onnx_export:export_model", ("quantize", "opset"),
                         ("onnx", "onnxscript", "onnxruntime")),
    "ctranslate2": ExportFormat("seq2seq.export.ctranslate2_export:convert_model", ("quantize",),
                                ("ctranslate2",)),
    "argos": ExportFormat("seq2seq.export.argos:package_model",
                          ("quantize", "from_code", "to_code", "from_name", "to_name",
                           "package_version", "sbd_model"), ("ctranslate2",)),
    "web": ExportFormat("seq2seq.export.web:export_web", (), ("onnx", "onnxscript", "onnxruntime"),
                        limits="its graphs are int8 (the smaller download; as fast)",
                        usage="serve it with python -m http.server --directory {output} and "
                              "open http://127.0.0.1:8000/ (docs/export.md#in-the-browser)"),
    "huggingface": ExportFormat("seq2seq.export.huggingface:convert_model", (),
                                ("transformers", "safetensors"), extra="hf",
                                limits="it writes float32 weights; for int8, export with "
                                       "format=ctranslate2 or format=onnx",
                                usage="load it with transformers' AutoModelForSeq2SeqLM"
                                      ".from_pretrained('{output}') (docs/export.md)"),
}


def export_format(name: str, options: Mapping[str, Any] | None = None) -> ExportFormat:
    """The format ``name``, once ``options`` (besides ``overwrite``) are checked against it:
    made before torch or a checkpoint is loaded.

    Raises:
        ExportError: for an unknown format or an option it does not take, in one line naming
            it (``quantize``'s mode and the output: :func:`~seq2seq.export.folder.check_export_options`).
    """
    if name not in FORMATS:
        raise ExportError(f"format must be one of {', '.join(FORMATS)}, got {name!r}")
    chosen = FORMATS[name]
    unknown = sorted(set(options or ()) - set(chosen.options) - {"overwrite"})
    if unknown:
        raise ExportError(f"format={name} takes no option {', '.join(unknown)}"
                          + (f": {chosen.limits}" if chosen.limits else ""))
    return chosen


def check_export_options(output: str | Path, *, quantize: str, overwrite: bool) -> None:
    """Refuse an unknown ``quantize`` or an existing ``output`` (without ``overwrite``) before
    any work is done.

    Raises:
        ExportError: naming the option.
    """
    try:
        check_quantize_mode(quantize)
    except ValueError as error:
        raise ExportError(str(error)) from None
    output = Path(output)
    if output.exists() and not overwrite:
        raise ExportError(f"{output} already exists: give overwrite=true to replace it, or "
                          "another output")
    if output.exists() and not (output.is_dir() and (
            (output / MANIFEST_NAME).is_file() or not any(output.iterdir()))):
        raise ExportError(f"{output} is not an exported model (no {MANIFEST_NAME}): "
                          "overwrite=true replaces only an earlier export")


def export_checkpoint(checkpoint: str | Path, output: str | Path, *, format: str = "onnx",
                      **options: Any) -> dict[str, Any]:
    """Export a checkpoint file to the folder ``output`` in ``format`` (a :data:`FORMATS`
    key); returns the manifest written. ``options`` are the format's writer's (``quantize``,
    ``overwrite``; ``opset`` for onnx; the languages, ``package_version`` and ``sbd_model``
    for argos); the trainer summary and the checkpoint's path go into the manifest.

    Raises:
        CheckpointError: on a missing, corrupted or unsafe checkpoint.
        ExportError: see the writer. An unknown format or option, a bad ``quantize`` or an
            existing output is refused before the checkpoint is read.
    """
    chosen = export_format(format, options)
    from seq2seq.checkpoint import load_checkpoint, model_from_checkpoint

    check_export_options(output, quantize=options.get("quantize", "none"),
                         overwrite=options.get("overwrite", False))
    module, _, function = chosen.writer.partition(":")
    writer = getattr(importlib.import_module(module), function)
    payload = load_checkpoint(checkpoint)
    model, tokenizers, config = model_from_checkpoint(payload, "cpu")
    return writer(model, tokenizers, config, output, trainer_state=payload.get("trainer_state"),
                  source=str(checkpoint), **options)
