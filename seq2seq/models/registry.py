"""The built-in encoders, decoders and attention scorers by short name.

A config names a built-in part by its registry name (``model.attention._target_: additive``)
and a user's own class by its import path (``my_module.CosineScorer``); a name has no dot, a
path has one. Checkpoints keep the config, so these names, not the modules the classes live
in, are part of the checkpoint format: moving a class changes only its entry here.

Each kind has its own names (``transformer`` is an encoder and a decoder); the model builder
(:mod:`seq2seq.models.build`) knows which kind each node is. The entries hold import paths,
not classes, so reading and checking a config does not import the models (nor torch).
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass
from typing import Any

from seq2seq.config_types import ConfigError, target_nodes

ENCODER, DECODER, SCORER = "encoder", "decoder", "scorer"


@dataclass(frozen=True)
class Component:
    """A built-in class, and what the model builder passes it besides its config node.

    Attributes:
        name: its registry name, what a config's ``_target_`` says.
        class_path: where the class lives, ``module.Class``.
        takes_attention: a decoder that attends with ``model.attention``'s scorer (wrapped in
            the shared :class:`~seq2seq.models.attention.Attention`).
        takes_encoder_final_size: a decoder whose initial state is computed from the
            encoder's final state.
    """

    name: str
    class_path: str
    takes_attention: bool = False
    takes_encoder_final_size: bool = False

    def load(self) -> type:
        module, _, name = self.class_path.rpartition(".")
        return getattr(importlib.import_module(module), name)


def _by_name(*components: Component) -> dict[str, Component]:
    return {component.name: component for component in components}


# The scorers' names are those of their config files (configs/model/attention/<name>.yaml).
COMPONENTS: dict[str, dict[str, Component]] = {
    # One name for both cells: ``rnn_type`` (gru | lstm) is an argument, as for the decoders.
    ENCODER: _by_name(
        Component("rnn", "seq2seq.models.encoder.RNNEncoder"),
        Component("transformer", "seq2seq.models.transformer.TransformerEncoder"),
    ),
    DECODER: _by_name(
        Component("bahdanau", "seq2seq.models.decoders.BahdanauDecoder",
                  takes_attention=True, takes_encoder_final_size=True),
        Component("luong", "seq2seq.models.decoders.LuongDecoder",
                  takes_attention=True, takes_encoder_final_size=True),
        # Brings its own multi-head attention and starts from an empty cache.
        Component("transformer", "seq2seq.models.transformer.TransformerDecoder"),
    ),
    SCORER: _by_name(
        Component("additive", "seq2seq.models.attention_scorers.AdditiveScorer"),
        Component("dot", "seq2seq.models.attention_scorers.DotScorer"),
        Component("scaled_dot", "seq2seq.models.attention_scorers.ScaledDotScorer"),
        Component("general", "seq2seq.models.attention_scorers.GeneralScorer"),
        Component("multihead", "seq2seq.models.attention_scorers.MultiHeadScorer"),
        Component("gaussian", "seq2seq.models.attention_scorers.GaussianScorer"),
        Component("location", "seq2seq.models.attention_scorers.LocationScorer"),
    ),
}


def is_class_path(target: str) -> bool:
    """Whether a ``_target_`` is an import path (a user's class) rather than a registry name."""
    return "." in target


def lookup(kind: str, target: str, *, key: str) -> Component | None:
    """The built-in part a ``_target_`` names, or ``None`` for an import path.

    Raises:
        ConfigError: for a name that is no built-in ``kind``; the message names ``key`` (the
            node, ``model.attention``) and the names there are.
    """
    if is_class_path(target):
        return None
    component = COMPONENTS[kind].get(target)
    if component is None:
        raise ConfigError(
            f"{key}._target_: {target!r} is no built-in {kind} (those are "
            f"{', '.join(COMPONENTS[kind])}); a class of your own is named by its import "
            "path, e.g. my_module.MyClass")
    return component


def class_name(kind: str, target: str) -> str:
    """The name of the class a ``_target_`` of ``kind`` names (``AdditiveScorer`` for
    ``additive``, ``CosineScorer`` for ``my_module.CosineScorer``), without importing it."""
    component = COMPONENTS[kind].get(target)
    return (component.class_path if component is not None else target).rpartition(".")[2]


def is_registered(target: str) -> bool:
    """Whether ``target`` is the registry name of a built-in part of any kind."""
    return any(target in components for components in COMPONENTS.values())


# -- version 1 of the checkpoint format ---------------------------------------------------------
# The import paths of the built-in classes in version 1's configs. Frozen: a class that moves
# later changes the registry, not what version 1 files say. The scorers lived in
# seq2seq.models.scorers and were named through seq2seq.models.attention, which re-exported them.
V1_BUILT_IN_PATHS = {
    "seq2seq.models.encoder.RNNEncoder": "rnn",
    "seq2seq.models.transformer.TransformerEncoder": "transformer",
    "seq2seq.models.decoders.BahdanauDecoder": "bahdanau",
    "seq2seq.models.decoders.LuongDecoder": "luong",
    "seq2seq.models.transformer.TransformerDecoder": "transformer",
    **{f"seq2seq.models.{module}.{cls}": name
       for module in ("attention", "scorers")
       for cls, name in (("AdditiveScorer", "additive"), ("DotScorer", "dot"),
                         ("ScaledDotScorer", "scaled_dot"), ("GeneralScorer", "general"),
                         ("MultiHeadScorer", "multihead"), ("GaussianScorer", "gaussian"),
                         ("LocationScorer", "location"))},
}


def name_of_v1_target(target):
    """A version-1 ``_target_``'s registry name where it names a built-in class; else itself."""
    return V1_BUILT_IN_PATHS.get(target, target) if isinstance(target, str) else target


def _name_built_in_classes(node):
    """Version 1 -> 2: every ``_target_`` that is a built-in class's version-1 import path (a
    multi-head scorer's inner one included) becomes its registry name; a user's class keeps
    its path. Returns new containers."""
    converted = copy.deepcopy(node)
    for _, target_node in target_nodes(converted):
        target_node["_target_"] = name_of_v1_target(target_node["_target_"])
    return converted


# Model options added since the last format version, at the value the configs written before
# them built with: a config without one reads as one with this value (resuming, the study).
ADDED_MODEL_OPTIONS: dict[str, Any] = {"share_all_embeddings": False}


def with_added_model_options(model_cfg: dict) -> dict:
    """``model_cfg`` (a ``model`` node) with :data:`ADDED_MODEL_OPTIONS` it lacks (a new dict)."""
    return {**ADDED_MODEL_OPTIONS, **model_cfg}


def upgrade_config(config: dict, version: int) -> dict:
    """A run config as format ``version`` wrote it, in today's form (a new dict).

    The steps run in order from ``version``; there is one, 1 -> 2 (built-in classes named by
    registry name). It changes nothing in a config of today's form, so a config whose version
    is not recorded (an exported folder's manifest, a run folder's config.yaml, a study record)
    can be given as version 1.
    """
    if version < 2 and isinstance(config.get("model"), dict):
        config = {**config, "model": _name_built_in_classes(config["model"])}
    return config
