"""Reading the data stage's settings from plain config containers (the `tokenizer` group and
`data.filter`), with one readable DataError per bad or unset value.

Configs arrive as plain nested dicts, e.g. what `OmegaConf.to_container(cfg, resolve=True)`
returns: no OmegaConf or Hydra import is needed here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from seq2seq.data.text_files import DataError
from seq2seq.data.tokenizer import MODEL_TYPES

# OmegaConf.to_container keeps an unset mandatory value as this string.
MISSING = "???"
_REQUIRED = object()


def get_setting(
    config: Mapping[str, Any], key: str, *, where: str, default: Any = _REQUIRED
) -> Any:
    """Returns ``config[key]``; an absent or "???" value gives ``default``.

    Args:
        where: The node's dotted path, for the error message (e.g. "data.filter").
        default: The value when unset; when not given, an unset value is an error.

    Raises:
        DataError: If the value is unset and there is no default, or `config` is no mapping.
    """
    if not isinstance(config, Mapping):
        raise DataError(f"{where} must be a mapping of settings, got {config!r}")
    value = config.get(key, MISSING)
    if isinstance(value, str) and value == MISSING:
        if default is _REQUIRED:
            raise DataError(f"{where}.{key} is not set")
        return default
    return value


@dataclass(frozen=True, kw_only=True)
class TokenizerSettings:
    """How the sentencepiece model(s) are trained: the `tokenizer` config group, each field
    described in docs/configuration.md."""

    model_type: str = "bpe"
    vocab_size: int = 8000
    joint: bool = True
    character_coverage: float = 1.0
    max_training_sentences: int = 2_000_000
    seed: int = 1
    prune_target_vocabulary: bool = True

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise DataError(
                f"unknown tokenizer.model_type {self.model_type!r}: expected one of "
                f"{', '.join(MODEL_TYPES)}"
            )
        if self.vocab_size < 5:
            raise DataError(f"tokenizer.vocab_size must be at least 5, got {self.vocab_size}")
        if not 0.0 < self.character_coverage <= 1.0:
            raise DataError(
                f"tokenizer.character_coverage must be in (0, 1], got {self.character_coverage}"
            )

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TokenizerSettings:
        """Reads the settings from the `tokenizer` node; unknown keys are ignored.

        Missing keys take the defaults; a null is converted like any value (`joint: null` is
        False).
        """
        return _read_settings(cls, config, where="tokenizer", nullable=False)


@dataclass(frozen=True, kw_only=True)
class FilterSettings:
    """Which training pairs are dropped: the `data.filter` config node, each field described
    in docs/configuration.md (None: no limit)."""

    max_length: int | None = 100
    max_length_ratio: float | None = 3.0

    def __post_init__(self) -> None:
        if self.max_length is not None and self.max_length < 1:
            raise DataError(f"data.filter.max_length must be positive, got {self.max_length}")
        if self.max_length_ratio is not None and self.max_length_ratio < 1.0:
            raise DataError(
                f"data.filter.max_length_ratio must be at least 1, got {self.max_length_ratio}"
            )

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> FilterSettings:
        """Reads the settings from the `data.filter` node (None: the defaults)."""
        if config is None:
            return cls()
        return _read_settings(cls, config, where="data.filter", nullable=True)


def _read_settings(cls: type, config: Mapping[str, Any], *, where: str, nullable: bool) -> Any:
    """Builds settings class `cls` from a config node, reading its fields in order: each value
    converted to the type of the field's default (every default is a bool, int, float or str),
    an unset one the default, a null kept as None where `nullable`."""
    defaults = cls()
    values = {}
    for field in dataclasses.fields(cls):
        default = getattr(defaults, field.name)
        value = get_setting(config, field.name, where=where, default=default)
        values[field.name] = None if nullable and value is None else type(default)(value)
    return cls(**values)
