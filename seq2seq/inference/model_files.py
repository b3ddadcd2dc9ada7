"""Loading a model of any kind, a checkpoint file or an exported folder, for decoding.

:func:`load_model_payload` reads any of them into one payload dict. :func:`model_from_payload`
turns a checkpoint's or an ONNX folder's into a decodable model
(:class:`~seq2seq.models.interfaces.DecodingModel`): the checkpoint's PyTorch model, or the
folder's :class:`~seq2seq.inference.onnx_model.OnnxModel`. A CTranslate2 folder
(:func:`is_ctranslate2`) has no such model: CTranslate2 runs its own search, and
:mod:`seq2seq.inference.runtimes` gives it its own translator.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from seq2seq.checkpoint import (
    CheckpointError,
    load_checkpoint,
    model_from_checkpoint,
    tokenizers_from_payload,
)
from seq2seq.inference.export_format import (
    CTRANSLATE2_FORMAT_NAME,
    ENCODER_FILE,
    FORMAT_NAME,
    FORMAT_VERSIONS,
    HUGGINGFACE_FORMAT_NAME,
    MANIFEST_NAME,
    QUANTIZE_MODES,
    STEP_FILE,
)
from seq2seq.inference.onnx_model import OnnxModel
from seq2seq.models.registry import upgrade_config
from seq2seq.ops import speed_up

# What ctranslate2.Translator reads from a CTranslate2 folder besides its vocabularies (whose
# file names depend on whether they are shared; it names a missing one itself).
CTRANSLATE2_FILES = ("model.bin", "config.json")


def read_manifest(folder: str | os.PathLike) -> dict[str, Any]:
    """The folder's manifest, checked for its format and version.

    Raises:
        CheckpointError: when the manifest is missing, unreadable, of another format or
            version, or names files the folder lacks.
    """
    folder = Path(folder)
    path = folder / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{folder} is not an exported model (no {MANIFEST_NAME})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"cannot read {path}: {error}") from None
    formats = {name: FORMAT_VERSIONS[name] for name in (FORMAT_NAME, CTRANSLATE2_FORMAT_NAME)}
    if isinstance(manifest, dict) and manifest.get("format") == HUGGINGFACE_FORMAT_NAME:
        raise CheckpointError(f"{folder} is a Hugging Face transformers folder: load it with "
                              "transformers (AutoModelForSeq2SeqLM.from_pretrained), or give "
                              "the checkpoint it was exported from")
    if not isinstance(manifest, dict) or manifest.get("format") not in formats:
        raise CheckpointError(f"{path} is not a {FORMAT_NAME} or {CTRANSLATE2_FORMAT_NAME} "
                              "manifest")
    ctranslate2 = manifest["format"] == CTRANSLATE2_FORMAT_NAME
    version, expected = manifest.get("format_version"), formats[manifest["format"]]
    if version != expected:
        raise CheckpointError(
            f"{folder} is an exported model of format version {version}; this seq2seq reads "
            f"version {expected}: export the checkpoint again with this version"
        )
    try:
        files = manifest["tokenizers"]["files"]
        checks = [isinstance(manifest["config"], dict), isinstance(files, dict), "src" in files,
                  manifest["tokenizers"]["joint"] or "tgt" in files,
                  manifest["export"]["quantize"] in QUANTIZE_MODES,
                  isinstance(manifest["parameters"], int)]
        # An ONNX folder's graphs and their state; a CTranslate2 folder's position tables.
        checks.append(isinstance(manifest["export"]["max_positions"], int) if ctranslate2
                      else isinstance(manifest["graphs"]["state"], list))
    except (KeyError, TypeError) as error:
        raise CheckpointError(f"{path} is damaged: it lacks {error}") from None
    if not all(checks):
        raise CheckpointError(f"{path} is damaged: an entry has the wrong type")
    model_files = CTRANSLATE2_FILES if ctranslate2 else (ENCODER_FILE, STEP_FILE)
    for name in (*model_files, *files.values()):
        if not (folder / name).is_file():
            raise CheckpointError(f"the exported model {folder} lacks its file {name}")
    return manifest


def is_ctranslate2(payload: dict[str, Any]) -> bool:
    """Whether a payload of :func:`load_model_payload` is a CTranslate2 folder's."""
    exported = payload.get("exported")
    return exported is not None and exported["manifest"]["format"] == CTRANSLATE2_FORMAT_NAME


def read_exported(folder: str | os.PathLike) -> dict[str, Any]:
    """An exported folder as a payload like a checkpoint's: ``config``, ``tokenizers`` (in
    :func:`~seq2seq.checkpoint.tokenizers_to_payload`'s form) and ``exported`` (its folder and
    manifest); no weights. A CheckpointError where :func:`read_manifest` refuses the folder.
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    entry = manifest["tokenizers"]

    def model_bytes(side: str) -> Tensor:
        data = (folder / entry["files"][side]).read_bytes()
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)

    tokenizers = {"joint": bool(entry["joint"]), "src": model_bytes("src")}
    tokenizers["tgt"] = tokenizers["src"] if entry["joint"] else model_bytes("tgt")
    if entry.get("tgt_kept_ids") is not None:
        tokenizers["tgt_kept_ids"] = torch.tensor(entry["tgt_kept_ids"], dtype=torch.int64)
    return {
        # The manifest keeps the config as the checkpoint had it, of a version it does not
        # record: converted as the oldest, which leaves today's form as it is.
        "config": upgrade_config(manifest["config"], 1),
        "tokenizers": tokenizers,
        "trainer_state": manifest.get("trainer_state"),
        "exported": {"folder": str(folder), "manifest": manifest},
    }


def load_model_payload(path: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint file (:func:`~seq2seq.checkpoint.load_checkpoint`) or an exported folder
    (:func:`read_exported`), read into one payload dict.

    Raises:
        CheckpointError: on a missing, corrupted or unsafe file, or a bad exported folder.
    """
    return read_exported(path) if Path(path).is_dir() else load_checkpoint(path)


def require_cpu(device: torch.device) -> None:
    """Raise a one-line ValueError unless ``device`` is the CPU, where exported models run."""
    if device.type != "cpu":
        raise ValueError(
            f"an exported model runs on the CPU (ONNX Runtime's CPU provider), not {device}: "
            "give device=cpu"
        )


def model_from_payload(payload: dict[str, Any], device: torch.device):
    """The decodable model and tokenizers of a payload from :func:`load_model_payload`: a
    checkpoint's PyTorch model on ``device`` with its speed kernels (:func:`seq2seq.ops.speed_up`),
    or an exported folder's :class:`OnnxModel` (the CPU only: callers resolve ``auto`` to the
    CPU for it).

    Raises:
        CheckpointError: when a checkpoint's config or weights do not make a model, or an
            exported graph cannot be loaded.
        ValueError: for an exported model on a device other than the CPU.
    """
    if "exported" not in payload:
        model, tokenizers, _ = model_from_checkpoint(payload, device)
        return speed_up(model), tokenizers
    if is_ctranslate2(payload):
        raise CheckpointError(
            f"{payload['exported']['folder']} is a CTranslate2 folder: it decodes alone, in "
            "translate.py, evaluate.py and serve.py; export the checkpoint with format=onnx "
            "for this")
    require_cpu(device)
    model = OnnxModel(payload["exported"]["folder"], payload["exported"]["manifest"])
    return model, tokenizers_from_payload(payload["tokenizers"])
