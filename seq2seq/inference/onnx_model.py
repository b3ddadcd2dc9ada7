"""An exported model folder, decoded by ONNX Runtime through the searches' step interface.

``seq2seq-export`` (:mod:`seq2seq.export.onnx_export`) writes a folder that needs neither this
package's training code nor PyTorch's model classes::

    manifest.json          format, format version, the run config, vocabulary, export settings
    encoder.onnx           src (B, S), src_lengths (B,) -> memory, mask, keys, initial state
    decoder_step.onnx      prev_tokens (N,), memory, mask, keys, state -> logits, weights, state
    source.model           sentencepiece model(s); target.model when the vocabularies differ

:class:`OnnxModel` offers ``encode`` / ``init_state`` / ``decode_step``
(:class:`~seq2seq.inference.search.DecodingModel`), so greedy search, beam search, ensembles
and attention output run unchanged on it. Tensors cross to ONNX Runtime as NumPy arrays that
share their memory (``Tensor.numpy()`` and ``torch.from_numpy`` copy nothing).

:func:`load_model_payload` reads either kind of model (a checkpoint file or an exported folder)
into one payload dict, and :func:`model_from_payload` turns either into a decodable model.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from seq2seq.checkpoint import (
    CheckpointError,
    load_checkpoint,
    model_from_checkpoint,
    tokenizers_from_payload,
)
from seq2seq.data.corpus import DataError

MANIFEST_NAME = "manifest.json"
FORMAT_NAME = "seq2seq-onnx"
# The manifest of a seq2seq-export format=ctranslate2 folder (ctranslate2.Translator reads it).
CTRANSLATE2_FORMAT_NAME = "seq2seq-ctranslate2"
FORMAT_VERSION = 1
ENCODER_FILE = "encoder.onnx"
STEP_FILE = "decoder_step.onnx"
# The encoder graph's outputs before the initial state entries, and the step graph's inputs
# after prev_tokens (then the state entries, in the manifest's order).
ENCODED_NAMES = ("memory", "mask", "keys")


def is_exported(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder with an export manifest (else: a checkpoint file)."""
    return Path(path, MANIFEST_NAME).is_file()


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
    if isinstance(manifest, dict) and manifest.get("format") == CTRANSLATE2_FORMAT_NAME:
        raise CheckpointError(
            f"{folder} is a CTranslate2 model: decode it with ctranslate2.Translator "
            "(docs/export.md), or export the checkpoint with format=onnx for these tools")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise CheckpointError(f"{path} is not a {FORMAT_NAME} manifest")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"{folder} is an exported model of format version {version}; this seq2seq reads "
            f"version {FORMAT_VERSION}: export the checkpoint again with this version"
        )
    try:
        files = manifest["tokenizers"]["files"]
        checks = (isinstance(manifest["config"], dict), isinstance(files, dict), "src" in files,
                  manifest["tokenizers"]["joint"] or "tgt" in files,
                  isinstance(manifest["graphs"]["state"], list),
                  manifest["export"]["quantize"] in ("none", "int8"),
                  isinstance(manifest["parameters"], int))
    except (KeyError, TypeError) as error:
        raise CheckpointError(f"{path} is damaged: it lacks {error}") from None
    if not all(checks):
        raise CheckpointError(f"{path} is damaged: an entry has the wrong type")
    for name in (ENCODER_FILE, STEP_FILE, *files.values()):
        if not (folder / name).is_file():
            raise CheckpointError(f"the exported model {folder} lacks its file {name}")
    return manifest


def read_exported(folder: str | os.PathLike) -> dict[str, Any]:
    """An exported folder as a payload like a checkpoint's: ``config``, ``tokenizers`` (in
    :func:`~seq2seq.checkpoint.tokenizers_to_payload`'s form) and ``exported`` (its folder and
    manifest); no weights.

    Raises:
        CheckpointError: see :func:`read_manifest`.
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
        "config": manifest["config"],
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


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def model_from_payload(payload: dict[str, Any], device: torch.device):
    """The decodable model and tokenizers of a payload from :func:`load_model_payload`: a
    checkpoint's PyTorch model on ``device``, or an exported folder's :class:`OnnxModel` (which
    runs on the CPU whatever ``device``: callers resolve ``auto`` to the CPU for it).

    Raises:
        CheckpointError: when a checkpoint's config or weights do not make a model, or an
            exported graph cannot be loaded.
        ValueError: for an exported model on a device other than the CPU.
    """
    if "exported" not in payload:
        return model_from_checkpoint(payload, device)[:2]
    require_cpu(device)
    model = OnnxModel(payload["exported"]["folder"], payload["exported"]["manifest"])
    return model, tokenizers_from_payload(payload["tokenizers"])


@functools.lru_cache(maxsize=16)
def _session(path: str, version: tuple[int, int, int], threads: int):
    """One ONNX Runtime session per graph file (and version of it) and thread count, reused
    by every model of the process that reads that file."""
    try:
        import onnxruntime
    except ImportError:
        raise CheckpointError(
            "decoding an exported model needs ONNX Runtime: pip install '.[export]'"
        ) from None
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only: no per-run shape notes on stderr
    # Between two steps the search runs PyTorch on the same cores: threads left spinning for
    # the next run would take the cores from it.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        return onnxruntime.InferenceSession(
            path, options, providers=["CPUExecutionProvider"]
        )
    except Exception as error:  # onnxruntime raises its own exception types, one per cause
        raise CheckpointError(f"cannot load {path}: {_first_line(error)}") from None


class ExportedEncoded(NamedTuple):
    """The encoder graph's outputs for a batch, reordered together by the searches.

    Attributes:
        memory: (B, S, D); mask: (B, S) bool; keys: the scorer's precomputed keys, (B, ...).
        initial_state: the decoder's initial state entries, each (B, ...), in the manifest's
            order.
    """

    memory: Tensor
    mask: Tensor
    keys: Tensor
    initial_state: tuple[Tensor, ...]

    def index_select(self, index: Tensor) -> ExportedEncoded:
        """Reorder or repeat sentences (dim 0), e.g. to expand a batch into beams."""
        return ExportedEncoded(
            *(t.index_select(0, index) for t in self[:3]),
            tuple(t.index_select(0, index) for t in self.initial_state),
        )


def _arrays(tensors) -> list[np.ndarray]:
    # Contiguous CPU tensors become arrays over the same memory.
    return [t.contiguous().numpy() for t in tensors]


class OnnxModel:
    """An exported folder's two graphs behind the searches' step interface.

    Args:
        folder: the exported folder.
        manifest: its manifest (:func:`read_manifest`).
        num_threads: ONNX Runtime's threads per graph; None: ``torch.get_num_threads()``, which
            the ``num_threads`` option of the command-line tools sets.

    Shape:
        as :class:`~seq2seq.inference.search.DecodingModel`; tensors live on the CPU.
    """

    def __init__(self, folder: str | os.PathLike, manifest: dict[str, Any], *,
                 num_threads: int | None = None, reuse_sessions: bool = True) -> None:
        self.folder = Path(folder)
        self.manifest = manifest
        self.state_names = tuple(manifest["graphs"]["state"])
        self.quantize = manifest["export"]["quantize"]  # none | int8
        self.parameter_count = int(manifest["parameters"])
        self.reuse_sessions = reuse_sessions
        threads = num_threads or torch.get_num_threads()
        self.encoder = self._load(ENCODER_FILE, threads)
        self.step = self._load(STEP_FILE, threads)
        self._step_inputs = [i.name for i in self.step.get_inputs()]
        self.training = False  # what Translator and Ensemble read from a model

    def _load(self, name: str, threads: int):
        path = self.folder / name
        stat = path.stat()
        version = (stat.st_mtime_ns, stat.st_size, stat.st_ino)  # a changed file: a new session
        load = _session if self.reuse_sessions else _session.__wrapped__
        return load(str(path.resolve()), version, threads)

    def _run(self, session, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        try:
            return session.run(None, feeds)
        except Exception as error:  # onnxruntime's own error types
            raise DataError(f"the exported model {self.folder} could not decode a batch: "
                            f"{_first_line(error)}") from None

    def eval(self) -> OnnxModel:
        return self

    def encode(self, src: Tensor, src_lengths: Tensor) -> ExportedEncoded:
        outputs = self._run(self.encoder, {"src": src.cpu().numpy(),
                                           "src_lengths": src_lengths.cpu().numpy()})
        tensors = [torch.from_numpy(array) for array in outputs]
        return ExportedEncoded(*tensors[:3], tuple(tensors[3:]))

    def init_state(self, encoded: ExportedEncoded) -> dict[str, Tensor]:
        return dict(zip(self.state_names, encoded.initial_state, strict=True))

    def decode_step(
        self, prev_tokens: Tensor, state: dict[str, Tensor], encoded: ExportedEncoded
    ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """Logits (N, V), attention weights (N, S) and the new state."""
        values = [prev_tokens, *encoded[:3], *(state[name] for name in self.state_names)]
        outputs = self._run(self.step, dict(zip(self._step_inputs, _arrays(values), strict=True)))
        logits, weights, *new_state = (torch.from_numpy(array) for array in outputs)
        return logits, weights, dict(zip(self.state_names, new_state, strict=True))
