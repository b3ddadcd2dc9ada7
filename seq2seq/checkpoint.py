"""Checkpoint files: atomic writes, safe reads, and rebuilding a model from one.

A checkpoint is a dict of plain tensors and containers only (no pickled classes), so it is
read with ``torch.load(path, weights_only=True)``, which refuses to run code. Entries:

- ``format_version``: int, :data:`FORMAT_VERSION`
- ``model``: the model's ``state_dict()``
- ``config``: the resolved run config as plain dicts/lists/scalars; its ``model`` node names
  the built-in encoder, decoder and scorer by registry name (:mod:`seq2seq.models.registry`)
  and a user's own class by import path; a fine-tuned run's also holds ``parent:
  {checkpoint: PATH, sha256: HEX}``, the checkpoint it started from
  (:mod:`seq2seq.training.finetune`); a training run's also holds ``trained_precision:
  bf16``, the precision it trained in (:data:`TRAINED_PRECISION`; not in runs before #67)
- ``tokenizers``: ``{"joint": bool, "src": uint8 tensor, "tgt": uint8 tensor}`` (sentencepiece
  model bytes)
- training only: ``optimizer``, ``schedule``, ``scaler``, ``trainer_state``, ``sampler``, ``rng``

A checkpoint of an older format version is converted on load (:func:`~seq2seq.models.registry.upgrade_config`), so
everything after :func:`load_checkpoint` sees today's form.
"""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

from seq2seq.atomic import atomic_write
from seq2seq.config_types import ConfigError, error_reason, target_nodes
from seq2seq.models import registry

# 1: the model config named the built-in classes by import path; 2: by registry name.
FORMAT_VERSION = 2
OLDEST_FORMAT_VERSION = 1
# The config entry where training records the precision it ran in: ``trainer.precision``
# itself, or what ``auto`` chose on that machine (the run's config.yaml holds it too).
TRAINED_PRECISION = "trained_precision"
# The encoder's RNN parameters as one bidirectional nn.GRU/LSTM named them, before #41 gave
# each layer and direction its own module.
_OLD_ENCODER_RNN_KEY = re.compile(r"encoder\.rnn\.(weight|bias)_(ih|hh)_l(\d+)(_reverse)?")


def upgrade_model_keys(state: dict) -> dict:
    """A model ``state_dict`` with the keys of earlier versions renamed to today's, in order."""
    def new_key(key: str) -> str:
        match = _OLD_ENCODER_RNN_KEY.fullmatch(key)
        if match is None:
            return key
        kind, gate, layer, reverse = match.groups()
        return f"encoder.layers.{layer}.{1 if reverse else 0}.{kind}_{gate}_l0"

    return {new_key(key): value for key, value in state.items()}


class CheckpointError(Exception):
    """A checkpoint that cannot be used; the message says why in one line."""


def save_checkpoint(payload: dict[str, Any], path: str | os.PathLike) -> None:
    """Write ``payload`` to ``path`` atomically (:func:`seq2seq.atomic.atomic_write`)."""
    with atomic_write(path) as handle:
        torch.save(payload, handle)


def load_weights_only(path: Path, what: str, error: type[Exception], **load_options) -> Any:
    """``torch.load`` of a file of tensors and plain containers (``weights_only=True``), with
    ``load_options``; ``error`` with a one-line reason, naming the file as ``what``, when it is
    missing, damaged, or holds other Python objects (which are never run)."""
    if not path.is_file():
        raise error(f"{what} not found: {path}")
    if not zipfile.is_zipfile(path):
        # torch.save writes zip archives; anything else is damaged or not ours (and torch
        # would read it as a legacy pickle and misreport it as unsafe).
        raise error(f"cannot read {what} {path}: the file is truncated or corrupted (not a "
                    "zip archive)")
    try:
        return torch.load(path, weights_only=True, **load_options)
    except pickle.UnpicklingError as exc:
        # Keep torch's reason (the offending global), not its advice to disable the check.
        reason = next((line.strip() for line in str(exc).splitlines()
                       if "Unsupported global" in line), "unsupported content")
        raise error(f"refusing to load {path}: it contains Python objects other than tensors "
                    f"and plain containers, which could run code ({reason})") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as exc:
        raise error(f"cannot read {what} {path}: the file is truncated or corrupted "
                    f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
                    ) from None


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu", *,
                    mmap: bool = False) -> dict:
    """Read a checkpoint (:func:`load_weights_only`), an older format version converted (see the
    module docstring); :class:`CheckpointError` on a bad file or an unknown format version.

    ``mmap``: map the tensors' storage instead of reading it (for a caller that reads the
    plain entries only).
    """
    path = Path(path)
    checkpoint = load_weights_only(path, "checkpoint", CheckpointError,
                                   map_location=map_location, mmap=mmap)
    if not isinstance(checkpoint, dict) or "model" not in checkpoint:
        raise CheckpointError(f"{path} is not a seq2seq checkpoint (no 'model' entry)")
    version = checkpoint.get("format_version")
    if not isinstance(version, int) or not OLDEST_FORMAT_VERSION <= version <= FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has checkpoint format version {version}; this seq2seq reads versions "
            f"{OLDEST_FORMAT_VERSION} to {FORMAT_VERSION}"
        )
    if isinstance(checkpoint.get("config"), dict):
        checkpoint["config"] = registry.upgrade_config(checkpoint["config"], version)
    checkpoint["format_version"] = FORMAT_VERSION  # what it holds now
    if isinstance(checkpoint["model"], dict):
        checkpoint["model"] = upgrade_model_keys(checkpoint["model"])
    return checkpoint


# The names a files corpus gives its two sides unless told the languages: not language codes.
UNNAMED_SIDES = ("src", "tgt")


# Names of the languages Multi30k holds, for a reader (an Argos package, LibreTranslate's
# /languages); other codes are shown as they are.
LANGUAGE_NAMES = {"cs": "Czech", "de": "German", "en": "English", "fr": "French"}


def recorded_languages(config: dict[str, Any]) -> tuple[str | None, str | None]:
    """The (source, target) language codes a run's config records (``data.src_lang``,
    ``data.tgt_lang``); None for a side it leaves unnamed (missing, or ``src``/``tgt``)."""
    data = config.get("data") or {}
    return tuple(code if isinstance(code, str) and code and code not in UNNAMED_SIDES else None
                 for code in (data.get("src_lang"), data.get("tgt_lang")))


def tokenizers_to_payload(tokenizers) -> dict[str, Any]:
    """Sentencepiece models as uint8 tensors, so the checkpoint stays weights-only readable."""

    def as_tensor(data: bytes) -> torch.Tensor:
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()

    payload = {
        "joint": bool(tokenizers.joint),
        "src": as_tensor(tokenizers.src.to_bytes()),
        "tgt": as_tensor(tokenizers.tgt.to_bytes()),
    }
    kept_ids = getattr(tokenizers.tgt, "kept_ids", None)
    if kept_ids is not None:  # a target vocabulary pruned to the pieces seen in training
        payload["tgt_kept_ids"] = torch.as_tensor(kept_ids, dtype=torch.int64)
    return payload


def tokenizers_from_payload(payload: dict[str, Any]):
    from seq2seq.data.tokenizer import SentencePieceTokenizer, Tokenizers

    src = SentencePieceTokenizer.from_bytes(payload["src"].numpy().tobytes())
    tgt = None if payload["joint"] else SentencePieceTokenizer.from_bytes(
        payload["tgt"].numpy().tobytes()
    )
    kept_ids = payload["tgt_kept_ids"].numpy() if "tgt_kept_ids" in payload else None
    return Tokenizers.of(src, tgt, kept_ids=kept_ids)


SAFE_TARGET_PREFIXES = ("seq2seq.", "torch.nn.")


def check_targets(node: Any, trusted: tuple[str, ...] | None = None) -> None:
    """Refuse ``_target_`` classes from outside seq2seq and torch.nn in a checkpoint's config.

    Building the model instantiates the classes its config names, so a crafted checkpoint
    could otherwise name any callable. Registry names (built-in parts) are always trusted.
    Your own classes are allowed by listing their module prefixes, comma-separated, in the
    environment variable ``SEQ2SEQ_TRUSTED_TARGETS``.
    """
    if trusted is None:
        extra = os.environ.get("SEQ2SEQ_TRUSTED_TARGETS", "")
        trusted = SAFE_TARGET_PREFIXES + tuple(p.strip() for p in extra.split(",") if p.strip())
    for _, target_node in target_nodes(node):
        target = target_node["_target_"]
        if not isinstance(target, str) or registry.is_registered(target):
            continue
        if not registry.is_class_path(target):
            raise CheckpointError(
                f"the checkpoint's config names {target!r}, which is neither a built-in part "
                "(seq2seq.models.registry) nor a class's import path"
            )
        if not target.startswith(trusted):
            raise CheckpointError(
                f"the checkpoint's config names the class {target!r}, outside the trusted "
                f"prefixes {', '.join(trusted)}; if you trust it, add its module to "
                "SEQ2SEQ_TRUSTED_TARGETS"
            )


def model_from_checkpoint(checkpoint: dict, device: str | torch.device = "cpu"):
    """``(model, tokenizers, config)`` a checkpoint was trained with, the model rebuilt in eval
    mode on ``device``."""
    from seq2seq.models.build import build_model

    config = checkpoint["config"]
    check_targets(config["model"])
    tokenizers = tokenizers_from_payload(checkpoint["tokenizers"])
    try:
        model = build_model(
            config["model"],
            src_vocab_size=tokenizers.src.vocab_size,
            tgt_vocab_size=tokenizers.tgt.vocab_size,
        )
    except ConfigError as error:
        raise CheckpointError(f"the checkpoint's config does not make a model: {error}") from None
    try:
        model.load_state_dict(checkpoint["model"])
    except RuntimeError as error:
        raise CheckpointError(
            f"the checkpoint's weights do not fit the model its config describes: "
            f"{error_reason(error)}"
        ) from None
    return model.to(device).eval(), tokenizers, config
