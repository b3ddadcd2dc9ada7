"""An exported model folder, decoded by ONNX Runtime through the searches' step interface.

The folder (``seq2seq-export``, :mod:`seq2seq.export.onnx_export`) holds a manifest, the
sentencepiece model(s), ``encoder.onnx`` (``encode`` then ``init_state``) and
``decoder_step.onnx`` (one ``decode_step``); docs/export.md ("The folder") gives their inputs
and outputs. :class:`OnnxModel` is a :class:`~seq2seq.models.interfaces.DecodingModel`, so
greedy search, beam search, ensembles and attention output run unchanged on it. Tensors cross
to ONNX Runtime as NumPy arrays that share their memory (``Tensor.numpy()`` and
``torch.from_numpy`` copy nothing).

Reading a folder (its manifest, its tokenizers) is :mod:`seq2seq.inference.model_files`'s job; its
file names are :mod:`seq2seq.inference.export_format`'s.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from seq2seq.checkpoint import CheckpointError
from seq2seq.config_types import error_reason
from seq2seq.data.text_files import DataError
from seq2seq.inference.export_format import ENCODER_FILE, STEP_FILE
from seq2seq.models.interfaces import DecodingModel, State


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
        raise CheckpointError(f"cannot load {path}: {error_reason(error)}") from None


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

    def cast_memory(self, dtype: torch.dtype) -> ExportedEncoded:
        return self  # the graphs take the types they were exported with


class OnnxModel(DecodingModel):
    """An exported folder's two graphs behind the searches' step interface: fp32 (or int8 weights
    where exported so), on the CPU only.

    Args:
        manifest: the folder's manifest (:func:`~seq2seq.inference.model_files.read_manifest`).
        num_threads: ONNX Runtime's threads per graph; None: ``torch.get_num_threads()``, which
            the ``num_threads`` option of the command-line tools sets.
        reuse_sessions: share the process's session of each graph file (False: load anew).
    """

    precisions = ("fp32",)  # ONNX Runtime runs the graphs in the types they were exported with
    cpu_only = True

    def __init__(self, folder: str | os.PathLike, manifest: dict[str, Any], *,
                 num_threads: int | None = None, reuse_sessions: bool = True) -> None:
        self.folder = Path(folder)
        self.manifest = manifest
        self.state_names = tuple(manifest["graphs"]["state"])
        self.quantize = manifest["export"]["quantize"]  # none | int8
        self._parameter_count = int(manifest["parameters"])
        self.reuse_sessions = reuse_sessions
        threads = num_threads or torch.get_num_threads()
        self.encoder = self._load(ENCODER_FILE, threads)
        self.step = self._load(STEP_FILE, threads)
        self._step_inputs = [i.name for i in self.step.get_inputs()]

    @property
    def parameter_count(self) -> int:
        return self._parameter_count  # the exporter counted them

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
                            f"{error_reason(error)}") from None

    def encode(self, src: Tensor, src_lengths: Tensor) -> ExportedEncoded:
        outputs = self._run(self.encoder, {"src": src.cpu().numpy(),
                                           "src_lengths": src_lengths.cpu().numpy()})
        tensors = [torch.from_numpy(array) for array in outputs]
        return ExportedEncoded(*tensors[:3], tuple(tensors[3:]))

    def init_state(self, encoded: ExportedEncoded) -> State:
        return dict(zip(self.state_names, encoded.initial_state, strict=True))

    def decode_step(
        self, prev_tokens: Tensor, state: State, encoded: ExportedEncoded, *,
        output_ids: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, State]:
        """Logits (N, V) (the graph scores every piece; ``output_ids`` keeps K columns),
        attention weights (N, S) and the new state."""
        values = [prev_tokens, *encoded[:3], *(state[name] for name in self.state_names)]
        arrays = [t.contiguous().numpy() for t in values]  # over the CPU tensors' memory
        outputs = self._run(self.step, dict(zip(self._step_inputs, arrays, strict=True)))
        logits, weights, *new_state = (torch.from_numpy(array) for array in outputs)
        if output_ids is not None:
            logits = logits.index_select(-1, output_ids)
        return logits, weights, dict(zip(self.state_names, new_state, strict=True))
