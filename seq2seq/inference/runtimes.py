"""Which runtime decodes a loaded model: the one place that tells them apart.

Every tool that decodes (translate, evaluate, serve, tune-decoding, the study) opens its model
here (:func:`open_model`):

- a checkpoint file or an ONNX folder (or a list of them, an ensemble): a
  :class:`~seq2seq.inference.translator.Translator`, whose searches run on the PyTorch model or
  ONNX Runtime's graphs alike;
- a CTranslate2 folder (``seq2seq-export ... format=ctranslate2``): a
  :class:`~seq2seq.inference.ctranslate2_translator.CTranslate2Translator`, which hands the
  search to CTranslate2 behind the same interface.

Both are :class:`~seq2seq.inference.translator.BaseTranslator` s: they take the same
per-call :class:`~seq2seq.inference.decode_options.DecodeOptions`, and the searches and the
translators never ask which runtime they hold. The simple path::

    translator = load_translator("best.pt")       # or an exported folder, or a list of them
    translations = translator.translate(["Ein Hund läuft."])   # beam 5, one translation each

The tools open models with :func:`open_model`, which also returns what the files record
beside the weights (the run config, the trainer summary).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from seq2seq.checkpoint import tokenizers_from_payload
from seq2seq.device import select_device
from seq2seq.inference.ctranslate2_translator import CTranslate2Translator
from seq2seq.inference.ensemble import Ensemble, check_same_vocabularies
from seq2seq.inference.model_files import is_ctranslate2, load_model_payload, model_from_payload
from seq2seq.inference.translator import BaseTranslator, Translator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpenedModel:
    """A ready translator and what its files record beside the weights.

    Attributes:
        translator: a :class:`Translator` or a CTranslate2 folder's translator.
        configs: each member's run config, in order (one: a single model).
        trainer_state: a single model's trainer summary, or None (an ensemble, a bare file).
    """

    translator: BaseTranslator
    configs: list[dict[str, Any]]
    trainer_state: dict[str, Any] | None

    @property
    def config(self) -> dict[str, Any]:
        """The (first) member's run config: its data, languages and model."""
        return self.configs[0]


def open_model(path: str | os.PathLike | Sequence[str | os.PathLike],
               device: str | torch.device = "cpu", **settings) -> OpenedModel:
    """Every decoding tool's one way to open a model: a checkpoint file, an ONNX or
    CTranslate2 folder, or a list of checkpoints and ONNX folders decoded as one ensemble
    (:mod:`seq2seq.inference.ensemble`).

    Args:
        device: ``"cpu"``, ``"cuda"``, ``"auto"``, ... (an exported folder: the CPU).
        **settings: what either translator takes besides its model (``max_tokens``,
            ``max_source_length``, ``precision``, ``quantize``, ``shortlist``).

    Raises:
        CheckpointError: on a missing, corrupted, unsafe or incompatible file or folder, or one
            CTranslate2 cannot load.
        ValueError: on no path, a setting the runtime cannot honour, a CTranslate2 folder in an
            ensemble, or an ensemble's members with other vocabularies.
    """
    paths = [path] if isinstance(path, str | os.PathLike) else list(path)
    if not paths:
        raise ValueError("no checkpoint given")
    names = [str(p) for p in paths]
    payloads = [load_model_payload(p) for p in paths]
    translator = _translator(payloads, device, names, settings)
    for difference in translator.differs:
        log.info("%s decodes with %s: %s", " + ".join(names), type(translator).__name__,
                 difference)
    state = payloads[0].get("trainer_state") if len(payloads) == 1 else None
    return OpenedModel(translator, [payload["config"] for payload in payloads],
                       state if isinstance(state, dict) else None)


def load_translator(path: str | os.PathLike | Sequence[str | os.PathLike],
                    device: str | torch.device = "cpu",
                    **settings) -> BaseTranslator:
    """The translator of :func:`open_model` (the simple path, for library callers)."""
    return open_model(path, device, **settings).translator


def _translator(payloads: Sequence[dict[str, Any]], device: str | torch.device,
                names: Sequence[str], settings: dict[str, Any]) -> BaseTranslator:
    """The translator of what :func:`~seq2seq.inference.model_files.load_model_payload` read."""
    if any(is_ctranslate2(payload) for payload in payloads):
        if len(payloads) > 1:
            index = next(i for i, payload in enumerate(payloads) if is_ctranslate2(payload))
            raise ValueError(f"{names[index]} is a CTranslate2 folder, which decodes alone: an "
                             "ensemble's members are checkpoints or ONNX folders")
        exported = payloads[0]["exported"]
        return CTranslate2Translator(exported["folder"], exported["manifest"],
                                     tokenizers_from_payload(payloads[0]["tokenizers"]),
                                     device=device, **settings)
    if device == "auto" and any("exported" in payload for payload in payloads):
        device = "cpu"  # ONNX Runtime's CPU provider runs exported models
    device = select_device(device)
    members = [model_from_payload(payload, device) for payload in payloads]
    if len(members) == 1:
        model, tokenizers = members[0]
        return Translator(model, tokenizers, device=device, **settings)
    check_same_vocabularies([tokenizers for _, tokenizers in members], names)
    return Translator(Ensemble([model for model, _ in members]), members[0][1], device=device,
                      **settings)
