"""Which runtime decodes a loaded model: the one place that tells them apart.

``translate.py``, ``evaluate.py`` and ``serve.py`` build their translator here from what
:func:`~seq2seq.inference.loading.load_model_payload` read:

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
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from seq2seq.checkpoint import tokenizers_from_payload
from seq2seq.device import select_device
from seq2seq.inference.ctranslate2_translator import CTranslate2Translator
from seq2seq.inference.ensemble import Ensemble, check_same_vocabularies
from seq2seq.inference.loading import is_ctranslate2, load_model_payload, model_from_payload
from seq2seq.inference.translator import BaseTranslator, Translator


def translator_from_payloads(payloads: Sequence[dict[str, Any]],
                             device: str | torch.device = "cpu", *,
                             names: Sequence[str] | None = None,
                             **settings) -> BaseTranslator:
    """The translator of one payload, or of several decoded as an ensemble
    (:mod:`seq2seq.inference.ensemble`).

    Args:
        payloads: what :func:`~seq2seq.inference.loading.load_model_payload` read.
        device: ``"cpu"``, ``"cuda"``, ``"auto"``, ...
        names: what to call each payload in an error message (default: its number).
        **settings: what either translator takes besides its model (``max_tokens``,
            ``max_source_length``, ``precision``, ``quantize``, ``shortlist``).

    Raises:
        CheckpointError: when a payload does not make a model, or CTranslate2 cannot load it.
        ValueError: on no payload, a setting the runtime cannot honour, a CTranslate2 folder
            in an ensemble, or an ensemble's members with other vocabularies.
    """
    if not payloads:
        raise ValueError("no checkpoint given")
    if any(is_ctranslate2(payload) for payload in payloads):
        if len(payloads) > 1:
            index = next(i for i, payload in enumerate(payloads) if is_ctranslate2(payload))
            name = names[index] if names is not None else payloads[index]["exported"]["folder"]
            raise ValueError(f"{name} is a CTranslate2 folder, which decodes alone: an "
                             "ensemble's members are checkpoints or ONNX folders")
        exported = payloads[0]["exported"]
        return CTranslate2Translator(exported["folder"], exported["manifest"],
                                     tokenizers_from_payload(payloads[0]["tokenizers"]),
                                     device=device, **settings)
    if device == "auto" and any("exported" in payload for payload in payloads):
        device = "cpu"  # ONNX Runtime's CPU provider runs exported models
    device = select_device(device)
    names = list(names) if names is not None else [
        f"checkpoint {number + 1}" for number in range(len(payloads))]
    members = [model_from_payload(payload, device) for payload in payloads]
    if len(members) == 1:
        model, tokenizers = members[0]
        return Translator(model, tokenizers, device=device, **settings)
    check_same_vocabularies([tokenizers for _, tokenizers in members], names)
    return Translator(Ensemble([model for model, _ in members]), members[0][1], device=device,
                      **settings)


def load_translator(path: str | os.PathLike | Sequence[str | os.PathLike],
                    device: str | torch.device = "cpu",
                    **settings) -> BaseTranslator:
    """:func:`translator_from_payloads` of a checkpoint file or an exported folder, or of a
    list of them (an ensemble).

    Raises:
        CheckpointError: on a missing, corrupted, unsafe or incompatible checkpoint or folder.
        ValueError: see :func:`translator_from_payloads`.
    """
    paths = [path] if isinstance(path, str | os.PathLike) else list(path)
    return translator_from_payloads([load_model_payload(p) for p in paths], device,
                                    names=[str(p) for p in paths], **settings)
