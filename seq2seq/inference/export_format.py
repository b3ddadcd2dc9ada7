"""The exported folder's format: its file names and manifest markers, without torch.

``seq2seq-export`` writes the folder (:mod:`seq2seq.export.onnx_export`,
:mod:`seq2seq.export.ctranslate2_export`); :mod:`seq2seq.inference.model_files` reads it. The
command-line tools use these names to tell a folder from a checkpoint before torch loads.
"""

from __future__ import annotations

import os
from pathlib import Path

MANIFEST_NAME = "manifest.json"
FORMAT_NAME = "seq2seq-onnx"
# The manifest of a seq2seq-export format=ctranslate2 folder (ctranslate2.Translator reads it).
CTRANSLATE2_FORMAT_NAME = "seq2seq-ctranslate2"
# The manifest of a format=huggingface folder (transformers loads it; our tools do not decode it).
HUGGINGFACE_FORMAT_NAME = "seq2seq-huggingface"
# Each format's version, the one place for it: the writers stamp it, the loader checks it.
FORMAT_VERSIONS = {FORMAT_NAME: 1, CTRANSLATE2_FORMAT_NAME: 1, HUGGINGFACE_FORMAT_NAME: 1}
# The weight formats of an export (and of decoding it): float as trained, or int8 weights.
QUANTIZE_MODES = ("none", "int8")
ENCODER_FILE = "encoder.onnx"
STEP_FILE = "decoder_step.onnx"
# The encoder graph's outputs before the initial state entries, and the step graph's inputs
# after prev_tokens (then the state entries, in the manifest's order).
ENCODED_NAMES = ("memory", "mask", "keys")


def check_quantize_mode(mode: str) -> str:
    """``mode`` if it names a quantization mode, else a one-line ValueError: the one check of
    ``quantize``, for export and decoding alike."""
    if mode not in QUANTIZE_MODES:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZE_MODES)}, got {mode!r}")
    return mode


def check_int8_decoding(quantize: str, exported: str, *, what: str, options: str = "") -> None:
    """Refuse ``quantize=int8`` for a ``what`` (model, folder) not exported in int8: a
    one-line ValueError naming the export command (its ``options`` before ``quantize``)."""
    if quantize == "int8" and exported != "int8":
        raise ValueError(
            f"quantize=int8 decodes a {what} exported with quantize=int8: run seq2seq-export "
            f"checkpoint=PATH output=DIR {options}quantize=int8, then give checkpoint=DIR")


def is_exported(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder with an export manifest (else: a checkpoint file)."""
    return Path(path, MANIFEST_NAME).is_file()
