"""Put a :class:`Seq2Seq` together from the ``model`` config node.

This is the one place the model's parts are instantiated from config (``_target_``). A
built-in part is named by its registry name (``additive``, :mod:`seq2seq.models.registry`),
resolved here to its class; a user plugs in their own encoder, decoder or scorer class by its
import path in an override, e.g. ``model.attention._target_=my_package.MyScorer``. The library
classes take plain arguments.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf

from seq2seq.config_types import (
    ConfigError,
    accepted_parameters,
    check_config,
    error_reason,
    locate_target,
)
from seq2seq.data.vocab import PAD_ID
from seq2seq.models import registry
from seq2seq.models.attention import NORMALIZERS, Attention
from seq2seq.models.interfaces import count_parameters  # noqa: F401  (re-exported for callers)
from seq2seq.models.registry import DECODER, ENCODER, SCORER
from seq2seq.models.seq2seq import Seq2Seq

# Keys of the ``model.attention`` node that configure the shared Attention, not the scorer.
ATTENTION_KEYS = ("normalizer",)


def build_model(model_cfg: Mapping, *, src_vocab_size: int, tgt_vocab_size: int) -> Seq2Seq:
    """Build the model described by ``model_cfg`` (the ``model`` node of the train config).

    The sizes that depend on each other are passed here rather than repeated in YAML: the
    vocabulary sizes, the scorer's query and key sizes, the decoder's output size when
    embeddings are tied, and the encoder's final size to a decoder that starts from the
    encoder's final state (the RNN decoders' bridge). The attention node's ``normalizer``
    (softmax or sparsemax, default softmax) belongs to the shared :class:`Attention`, not to
    the scorer, so it is taken out of the node before the scorer is instantiated; any scorer
    class, a user's included, works with either normalizer.
    """
    # One table for source, target and output ties the target's to the output too.
    tie = bool(model_cfg.get("tie_embeddings", False) or model_cfg.get("share_all_embeddings"))
    encoder = _instantiate(resolve_targets(model_cfg["encoder"], ENCODER, "model.encoder"),
                           "model.encoder", vocab_size=src_vocab_size, padding_idx=PAD_ID)
    decoder_cfg = model_cfg["decoder"]
    extra = {}
    if uses_scorer(decoder_cfg):
        scorer_cfg, normalizer = split_attention_config(model_cfg["attention"])
        scorer = _instantiate(
            resolve_targets(scorer_cfg, SCORER, "model.attention"),
            "model.attention",
            query_dim=decoder_cfg["hidden_size"],
            key_dim=encoder.output_size,
        )
        extra["attention"] = Attention(scorer, normalizer=normalizer)
        if tie:
            extra["output_dim"] = decoder_cfg["embed_dim"]
    if decoder_takes(decoder_cfg, "encoder_final_size"):
        extra["encoder_final_size"] = encoder.output_size
    decoder = _instantiate(
        resolve_targets(decoder_cfg, DECODER, "model.decoder"),
        "model.decoder",
        vocab_size=tgt_vocab_size,
        encoder_output_size=encoder.output_size,
        padding_idx=PAD_ID,
        **extra,
    )
    return Seq2Seq(encoder=encoder, decoder=decoder, tie_embeddings=tie,
                   share_all_embeddings=bool(model_cfg.get("share_all_embeddings", False)),
                   word_dropout=float(model_cfg.get("word_dropout", 0.0)))


def _instantiate(node: Mapping, key: str, **arguments):
    """``instantiate(node, **arguments)``; a constructor's error becomes a ConfigError that
    names the node (``model.decoder: hidden_size must be greater than zero``)."""
    try:
        return instantiate(node, **arguments)
    except InstantiationException as error:
        raise ConfigError(f"{key}: {error_reason(error)}") from error


def resolve_targets(node, kind: str, key: str):
    """``node`` as plain containers for ``instantiate``, each registry name in a ``_target_``
    (its own and those of nodes inside it, a multi-head scorer's inner scorer) replaced by its
    class's import path; an import path is kept.

    Raises:
        ConfigError: for a name that is no built-in ``kind``, naming the node's key.
    """
    if isinstance(node, DictConfig | ListConfig):
        node = OmegaConf.to_container(node, resolve=True)
    if isinstance(node, list):
        return [resolve_targets(value, kind, f"{key}[{index}]") for index, value in enumerate(node)]
    if not isinstance(node, Mapping):
        return node
    resolved = {name: resolve_targets(value, kind, f"{key}.{name}") for name, value in node.items()}
    target = resolved.get("_target_")
    component = registry.lookup(kind, target, key=key) if isinstance(target, str) else None
    if component is not None:
        resolved["_target_"] = component.class_path
    return resolved


def decoder_takes(decoder_cfg: Mapping, argument: str, *, key: str = "model.decoder") -> bool:
    """Whether the decoder is built with ``argument`` (``attention``, ``encoder_final_size``):
    a built-in's registry entry says; a user's class, its signature (or its ``**kwargs``)."""
    target = str(decoder_cfg["_target_"])
    component = registry.lookup(DECODER, target, key=key)
    if component is not None:
        return getattr(component, f"takes_{argument}")
    decoder_class = locate_target(target)
    if decoder_class is None:  # not importable: instantiate reports it
        return True
    accepted = accepted_parameters(decoder_class)
    return accepted is None or argument in accepted[0] or accepted[2]


def uses_scorer(decoder_cfg: Mapping, *, key: str = "model.decoder") -> bool:
    """Whether the decoder takes an ``attention`` (the RNN decoders, a scorer from
    ``model.attention``) or brings its own (the Transformer's multi-head attention, which then
    leaves the ``model.attention`` node unused)."""
    return decoder_takes(decoder_cfg, "attention", key=key)


def split_attention_config(attention_cfg: Mapping) -> tuple[dict, str]:
    """Split the ``model.attention`` node into the scorer's node and the normalizer's name.

    Works on plain dicts and DictConfigs alike, and leaves ``attention_cfg`` itself unchanged.
    """
    scorer_cfg = {key: value for key, value in attention_cfg.items() if key not in ATTENTION_KEYS}
    return scorer_cfg, str(attention_cfg.get("normalizer", "softmax"))


# Keys of the model's nodes that are sizes or counts: each must be a positive integer.
_POSITIVE_KEY_SUFFIXES = ("_size", "_dim", "_layers", "heads", "d_model")


def _check_positive_sizes(node, key: str) -> None:
    if isinstance(node, Mapping):
        for name, value in node.items():
            path = f"{key}.{name}"
            if (str(name).endswith(_POSITIVE_KEY_SUFFIXES) and isinstance(value, int)
                    and not isinstance(value, bool) and value < 1):
                raise ConfigError(f"{path} must be a positive integer, got {value}")
            _check_positive_sizes(value, path)


def check_model_config(model_cfg: Mapping, *, key: str = "model", vocab_size: int = 1000) -> None:
    """Check the ``model`` node's values before anything is built or any data is read.

    Besides each value on its own, the model is built once on PyTorch's ``meta`` device (no
    memory, a fraction of a second; ``vocab_size`` pieces on each side), so that settings which
    cannot work together (a scorer whose sizes do not match, heads that do not divide the
    width) are refused here with the constructor's reason rather than after the data stage. A
    part that cannot be built on ``meta`` at all (a user's class that reads a tensor's value)
    is left to the real build.

    Raises:
        ConfigError: naming the key of a value its class cannot take (see
            :mod:`seq2seq.config_types`), a ``_target_`` that is neither a registry name nor
            an import path, a size or count below 1, an unknown ``attention.normalizer``, a
            ``word_dropout`` outside [0, 1), no ``attention`` node for a decoder that takes
            one, or parts that cannot be built together.
    """
    word_dropout = model_cfg.get("word_dropout", 0.0)
    if isinstance(word_dropout, bool) or not isinstance(word_dropout, (int, float)) \
            or not 0 <= word_dropout < 1:
        raise ConfigError(f"{key}.word_dropout must be a number in [0, 1), got {word_dropout!r}")
    # The argument checks read each class's signature: registry names resolved to the classes.
    resolved = {**model_cfg,
                "encoder": resolve_targets(model_cfg["encoder"], ENCODER, f"{key}.encoder"),
                "decoder": resolve_targets(model_cfg["decoder"], DECODER, f"{key}.decoder")}
    if model_cfg.get("attention") is None:  # model/attention=null, as the Transformer preset sets
        if uses_scorer(model_cfg["decoder"], key=f"{key}.decoder"):
            raise ConfigError(f"{key}.attention: the decoder {model_cfg['decoder']['_target_']} "
                              "takes an attention scorer; choose one, e.g. model/attention=additive")
    else:
        scorer_cfg, normalizer = split_attention_config(model_cfg["attention"])
        if normalizer not in NORMALIZERS:
            raise ConfigError(f"{key}.attention.normalizer must be one of "
                              f"{', '.join(NORMALIZERS)}, got {normalizer!r}")
        resolved["attention"] = resolve_targets(scorer_cfg, SCORER, f"{key}.attention")
    check_config(resolved, key)
    _check_positive_sizes(model_cfg, key)
    try:
        with torch.device("meta"):
            build_model(model_cfg, src_vocab_size=vocab_size, tgt_vocab_size=vocab_size)
    except (ValueError, TypeError, ZeroDivisionError, RuntimeError, NotImplementedError) as error:
        root = error
        while root.__cause__ is not None:
            root = root.__cause__
        if isinstance(root, RuntimeError | NotImplementedError):
            return  # not buildable on "meta" (e.g. Tensor.item()): the real build will tell
        if isinstance(error, ConfigError):
            raise
        raise ConfigError(f"{key}: {error_reason(error)}") from error
