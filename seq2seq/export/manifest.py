"""An exported folder's ``manifest.json``: the entries every export format shares, built and
written in one place; each exporter adds only what is its own (the ONNX graphs' names, the
CTranslate2 position tables, its own runtime's version...).

Every format's manifest has ``format``, ``format_version``, ``package_version``, the run
``config``, ``parameters``, ``trainer_state``, the ``vocabulary`` (sizes, special ids,
``target_ids``), the ``tokenizers`` files, and an ``export`` entry with ``quantize``,
``source``, ``torch_version`` and ``seconds``. :mod:`seq2seq.inference.model_files` reads them;
docs/export.md states them for services that are not this package.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import seq2seq
from seq2seq.atomic import write_bytes, write_text
from seq2seq.checkpoint import tokenizers_to_payload
from seq2seq.data.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from seq2seq.inference.export_format import FORMAT_VERSIONS, MANIFEST_NAME
from seq2seq.models.build import count_parameters

# The sentencepiece models' file names in an exported folder (source, target).
TOKENIZER_FILES = ("source.model", "target.model")


def vocabulary_entry(tokenizers) -> dict[str, Any]:
    """The manifest's ``vocabulary``: the sizes, the special ids and ``target_ids``."""
    return {"source_size": tokenizers.src.vocab_size, "target_size": tokenizers.tgt.vocab_size,
            "pad_id": PAD_ID, "bos_id": BOS_ID, "eos_id": EOS_ID, "unk_id": UNK_ID,
            # An output column (and a prev_tokens value) is an index into this list of the
            # target model's sentencepiece ids (a pruned target keeps a subset).
            "target_ids": tokenizers.target_ids.tolist()}


def write_tokenizers(folder: Path, tokenizers, names: tuple[str, str] = TOKENIZER_FILES
                     ) -> dict[str, Any]:
    """Write the sentencepiece model(s) into ``folder`` as ``names`` (source, target; the
    target's only when it has its own); returns the manifest's ``tokenizers`` entry (the file
    names, whether one model serves both sides, the kept target ids)."""
    token_payload = tokenizers_to_payload(tokenizers)
    files = {"src": names[0]}
    write_bytes(folder / files["src"], token_payload["src"].numpy().tobytes())
    if not token_payload["joint"]:
        files["tgt"] = names[1]
        write_bytes(folder / files["tgt"], token_payload["tgt"].numpy().tobytes())
    kept = token_payload.get("tgt_kept_ids")
    return {"joint": bool(token_payload["joint"]), "files": files,
            "tgt_kept_ids": kept.tolist() if kept is not None else None}


def build_manifest(folder: Path, model: nn.Module, tokenizers, config: dict[str, Any], *,
                   format_name: str, quantize: str,
                   trainer_state: dict[str, Any] | None, source: str | None,
                   tokenizer_files: tuple[str, str] = TOKENIZER_FILES) -> dict[str, Any]:
    """The entries of every export format's manifest, with the sentencepiece model(s) written
    into ``folder`` as ``tokenizer_files`` (the ``tokenizers`` entry names them).

    The exporter adds its own entries, and its own settings to ``export``, before
    :func:`write_manifest` writes it.
    """
    return {
        "format": format_name,
        "format_version": FORMAT_VERSIONS[format_name],
        "package_version": seq2seq.__version__,
        "config": config,
        "parameters": count_parameters(model),
        "trainer_state": trainer_state,
        "vocabulary": vocabulary_entry(tokenizers),
        "tokenizers": write_tokenizers(folder, tokenizers, tokenizer_files),
        "export": {"quantize": quantize, "source": source, "torch_version": torch.__version__},
    }


def write_manifest(folder: Path, manifest: dict[str, Any], *, started: float) -> None:
    """Write ``manifest`` (its ``export.seconds``: the time since ``started``, a
    ``time.perf_counter()`` reading) as the folder's ``manifest.json``, atomically."""
    manifest["export"]["seconds"] = round(time.perf_counter() - started, 1)
    # A checkpoint holds plain containers; anything else would be written as its repr.
    text = json.dumps(manifest, indent=1, default=repr)
    write_text(folder / MANIFEST_NAME, text + "\n")
