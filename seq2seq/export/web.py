"""``seq2seq-export ... format=web``: a folder that is a whole static web page which translates
in the reader's browser, offline, with nothing sent anywhere.

The folder is the int8 ONNX export (:mod:`seq2seq.export.onnx_export`, so ``translate.py
checkpoint=FOLDER`` decodes it too) with the page beside it: ``index.html`` and ``page.mjs``,
``translator.mjs`` (greedy search in JavaScript), ``runtime/`` (ONNX Runtime Web and
sentencepiece-js, from web/node_modules) and ``shims/``; docs/export.md ("In the browser") says
what each holds. The manifest's ``web`` entry gives what the page needs beyond the ONNX
folder's (the corpus tags as pieces).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from torch import nn

from seq2seq.export import ExportError, check_export_options
from seq2seq.export.folder import staged_folder
from seq2seq.export.manifest import write_manifest

PAGE = Path(__file__).with_name("web_page")
# Where the npm packages are: SEQ2SEQ_WEB_RUNTIME, else the checkout's web/node_modules.
RUNTIME_PACKAGES = Path(__file__).resolve().parents[2] / "web" / "node_modules"
# What the page loads from runtime/, and where each comes from in the npm packages.
RUNTIME_FILES = {
    "ort.wasm.min.mjs": "onnxruntime-web/dist/ort.wasm.min.mjs",
    "ort-wasm-simd-threaded.mjs": "onnxruntime-web/dist/ort-wasm-simd-threaded.mjs",
    "ort-wasm-simd-threaded.wasm": "onnxruntime-web/dist/ort-wasm-simd-threaded.wasm",
    "sentencepiece.mjs": "@sctg/sentencepiece-js/dist/index.js",
}


def runtime_folder() -> Path:
    """The npm packages the page's runtime is copied from; an ExportError naming how to install
    them when one of :data:`RUNTIME_FILES` is not there."""
    folder = Path(os.environ.get("SEQ2SEQ_WEB_RUNTIME") or RUNTIME_PACKAGES)
    missing = [path for path in RUNTIME_FILES.values() if not (folder / path).is_file()]
    if missing:
        raise ExportError(f"format=web copies ONNX Runtime Web and sentencepiece-js from "
                          f"{folder}, which lacks {missing[0]}: run npm ci --prefix web (make "
                          "install does where npm is), or set SEQ2SEQ_WEB_RUNTIME to a "
                          "node_modules folder that has them")
    return folder


def export_web(model: nn.Module, tokenizers, config: dict[str, Any], output: str | Path, *,
               overwrite: bool = False, trainer_state: dict[str, Any] | None = None,
               source: str | None = None) -> dict[str, Any]:
    """Export ``model`` as a static page in the folder ``output``; returns the manifest.
    Arguments as for :func:`seq2seq.export.onnx_export.export_model`; the graphs are int8,
    embedding tables included (the smaller download, as fast).

    Raises:
        ExportError: as for the ONNX export, or without the runtime's npm packages.
        OSError: when the folder cannot be written.
    """
    from seq2seq.export.onnx_export import export_model

    runtime_folder()
    check_export_options(output, quantize="int8", overwrite=overwrite)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="seq2seq-web-") as scratch:
        graphs = Path(scratch, "onnx")
        export_model(model, tokenizers, config, graphs, quantize="int8", quantize_embeddings=True,
                     trainer_state=trainer_state, source=source)
        return write_page(graphs, output, overwrite=overwrite, started=started)


def write_page(folder: str | Path, output: str | Path, *, overwrite: bool = False,
               started: float | None = None) -> dict[str, Any]:
    """The ONNX export ``folder`` with the page beside it, as the folder ``output`` (written
    whole or not at all); returns its manifest (``started``: the ``time.perf_counter()`` its
    ``export.seconds`` count from; default now).

    Raises:
        ExportError: without the runtime's npm packages, or when ``output`` exists.
        CheckpointError: when ``folder`` is not an ONNX export.
    """
    from seq2seq.checkpoint import tokenizers_from_payload
    from seq2seq.inference.model_files import read_exported

    runtime = runtime_folder()
    check_export_options(output, quantize="none", overwrite=overwrite)
    started = time.perf_counter() if started is None else started
    exported = read_exported(folder)
    manifest = exported["exported"]["manifest"]
    source = tokenizers_from_payload(exported["tokenizers"]).src
    with staged_folder(Path(output), overwrite=overwrite) as staging:
        shutil.copytree(folder, staging, dirs_exist_ok=True)
        shutil.copytree(PAGE, staging, dirs_exist_ok=True)
        (staging / "runtime").mkdir()
        for name, path in RUNTIME_FILES.items():
            shutil.copyfile(runtime / path, staging / "runtime" / name)
        # Longest first, as the Python tokenizer matches a leading tag.
        tags = sorted(source.user_symbols, key=len, reverse=True)
        manifest["web"] = {
            "user_symbols": {tag: source.encode([tag])[0][0] for tag in tags},
            "runtime": {name: path.split("/dist/")[0] for name, path in RUNTIME_FILES.items()},
        }
        write_manifest(staging, manifest, started=started)
    return manifest
