"""The models a server offers: a translator and its default options per name, plus what
``GET /v1/models`` tells."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from seq2seq.inference.decode_options import DecodeOptions

# The trainer's summary fields worth showing (TrainerState in a trainer's checkpoint).
TRAINING_FIELDS = ("step", "epoch", "tokens_seen", "train_seconds", "best_bleu", "best_step")


@dataclass
class ServedModel:
    """One model of the server: its translator
    (:class:`~seq2seq.inference.translator.BaseTranslator`), the options a request is decoded
    with unless it says otherwise, and what ``GET /v1/models`` tells of it: the attention
    scorer's class name, its number of parameters, the trainer's summary from the checkpoint and
    the (source, target) language codes the checkpoint records (each None when unknown)."""

    translator: Any
    options: DecodeOptions = field(default_factory=DecodeOptions)
    scorer: str | None = None
    parameters: int = 0
    training: dict[str, Any] | None = None
    languages: tuple[str, str] | None = None

    @property
    def attention(self) -> str | None:
        """What its attention matrices show where they are not the model's own (a CTranslate2
        folder's alignment head), or None."""
        return self.translator.attention_source

    def defaults(self) -> dict[str, Any]:
        """The options a request gets unless it sets them."""
        return {**asdict(self.options), "max_source_length": self.translator.max_source_length}


def _scorer_of_module(model) -> str | None:
    decoder = getattr(model, "decoder", None)
    attention = getattr(decoder, "attention", None)
    if attention is None and hasattr(decoder, "attention_heads"):
        return type(decoder).__name__  # a Transformer's own multi-head attention
    scorer = getattr(attention, "scorer", attention)
    return type(scorer).__name__ if scorer is not None else None


def _scorer_of_config(model_cfg: dict[str, Any]) -> str | None:
    """The scorer's class name, or the Transformer decoder's, which takes none: read from the
    names alone (an exported folder's config is not imported)."""
    from seq2seq.models.registry import DECODER, SCORER, class_name

    decoder = class_name(DECODER, str((model_cfg.get("decoder") or {}).get("_target_", "")))
    if decoder == "TransformerDecoder":
        return decoder
    target = (model_cfg.get("attention") or {}).get("_target_")
    return class_name(SCORER, str(target)) if target else None


def load_model(
    path: str | os.PathLike | list[str | os.PathLike], *, device: str = "cpu",
    options: DecodeOptions | None = None, **settings
) -> ServedModel:
    """Load a checkpoint (weights only) or an exported folder into a Translator (a CTranslate2
    folder: its own translator, :mod:`seq2seq.inference.runtimes`) and describe it.

    ``path`` may also be a list of them, served as one ensemble (its scorer is the members'
    scorers joined by ``+``, its parameters their sum; no training summary). ``options``: what a
    request is decoded with unless it says otherwise (default: beam 5); ``settings``: the
    translator's (:func:`~seq2seq.inference.runtimes.open_model`).

    Raises:
        CheckpointError: on a missing, corrupted, unsafe or incompatible checkpoint.
        ValueError: on an invalid decoding option.
    """
    from seq2seq.checkpoint import recorded_languages
    from seq2seq.inference.runtimes import open_model

    opened = open_model(path, device, **settings)
    translator = opened.translator
    options = options or DecodeOptions()
    translator.check(options)
    scorers = [_scorer_of_config(config.get("model", {})) for config in opened.configs]
    training = ({name: opened.trainer_state[name] for name in TRAINING_FIELDS
                 if name in opened.trainer_state} if opened.trainer_state is not None else None)
    if len(scorers) == 1:
        scorer = scorers[0] or _scorer_of_module(translator.model)
    else:
        scorer = "+".join(s or "?" for s in scorers)
    languages = recorded_languages(opened.config)  # an ensemble: its first member's
    return ServedModel(
        translator,
        options,
        scorer=scorer,
        parameters=translator.parameter_count,  # every member's, an exported one's included
        training=training,
        languages=None if None in languages else languages,
    )
