"""The models a server offers: a Translator per name, plus what ``GET /v1/models`` tells."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

# The trainer's summary fields worth showing (TrainerState in a trainer's checkpoint).
TRAINING_FIELDS = ("step", "epoch", "tokens_seen", "train_seconds", "best_bleu", "best_step")


@dataclass
class ServedModel:
    """One model of the server.

    Attributes:
        translator: its :class:`~seq2seq.inference.translator.Translator`, with the server's
            default decoding options.
        scorer: the attention scorer's class name, or None when unknown.
        parameters: its number of parameters.
        training: the trainer's summary from the checkpoint, or None.
        attention: what its attention matrices show where they are not the model's own (a
            CTranslate2 folder's translator says, in ``attention_source``), or None.
    """

    translator: Any
    scorer: str | None = None
    parameters: int = 0
    training: dict[str, Any] | None = None
    attention: str | None = None

    @classmethod
    def wrap(cls, translator) -> ServedModel:
        """A model described from its Translator alone (no checkpoint at hand)."""
        model = getattr(translator, "model", None)
        parameters = getattr(translator, "parameter_count", None)  # of the model as trained
        if parameters is None:
            from seq2seq.models.build import count_parameters

            parameters = count_parameters(model) if model is not None else 0
        return cls(translator, scorer=_scorer_of_module(model), parameters=parameters,
                   attention=getattr(translator, "attention_source", None))

    def defaults(self) -> dict[str, Any]:
        t = self.translator
        names = ("beam_size", "nbest", "length_penalty", "max_len_a", "max_len_b",
                 "max_source_length", "search")
        defaults = {name: getattr(t, name) for name in names if hasattr(t, name)}
        sampling = getattr(t, "sampling", None)  # what a search=sample request gets unless set
        if sampling is not None:
            defaults.update(sampling._asdict())
        return defaults


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
    path: str | os.PathLike | list[str | os.PathLike], *, device: str = "cpu", **options
) -> ServedModel:
    """Load a checkpoint (weights only) or an exported folder into a Translator (a CTranslate2
    folder: its own translator, :mod:`seq2seq.inference.runtimes`) and describe it.

    Args:
        path: a checkpoint file or an exported folder, or a list of them served as one
            ensemble (its scorer is the members' scorers joined by ``+``, its parameters their
            sum; no training summary).
        device: ``"cpu"``, ``"cuda"``, ``"auto"``, ...
        **options: keyword arguments of :class:`~seq2seq.inference.translator.Translator`.

    Raises:
        CheckpointError: on a missing, corrupted, unsafe or incompatible checkpoint.
        ValueError: on an invalid decoding option.
    """
    from seq2seq.inference.loading import load_model_payload
    from seq2seq.inference.runtimes import translator_from_payloads

    paths = list(path) if isinstance(path, list | tuple) else [path]
    checkpoints = [load_model_payload(p) for p in paths]
    # A Translator, or a CTranslate2 folder's own translator (the same interface).
    translator = translator_from_payloads(
        checkpoints, device, names=[str(p) for p in paths], **options
    )
    scorers = [_scorer_of_config(checkpoint["config"].get("model", {}))
               for checkpoint in checkpoints]
    state = checkpoints[0].get("trainer_state") if len(checkpoints) == 1 else None
    training = (
        {name: state[name] for name in TRAINING_FIELDS if name in state}
        if isinstance(state, dict) else None
    )
    if len(checkpoints) == 1:
        scorer = scorers[0] or _scorer_of_module(getattr(translator, "model", None))
    else:
        scorer = "+".join(s or "?" for s in scorers)
    return ServedModel(
        translator,
        scorer=scorer,
        parameters=translator.parameter_count,  # every member's, an exported one's included
        training=training,
        attention=getattr(translator, "attention_source", None),  # None: the model's own
    )
