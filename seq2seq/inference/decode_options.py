"""What one ``translate`` call searches for: the request object of every translator.

A translator holds a model; a :class:`DecodeOptions` says how to decode with it, and is passed
with each call (``translator.translate(sentences, options)``). ``translate.py`` and
``evaluate.py`` build one from their config, the server one per request (its defaults with the
request's fields over them), library callers their own or the defaults
(``translate(sentences)``). Its checks run in its constructor, so a value out of range is
refused in one line before any model is loaded or any sentence decoded; what one runtime
cannot do (a CTranslate2 folder: phrases, epsilon) is its translator's check
(:meth:`~seq2seq.inference.translator.BaseTranslator.check`).

The options are declared here once: the tools check a config's values against these types
(:func:`option_types`) before torch loads, which this module imports only when options are made.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from seq2seq.inference.searches import Search


def option(default: Any, meaning: str) -> Any:
    """A :class:`DecodeOptions` field: its default and what it means (one place for both)."""
    return field(default=default, metadata={"help": meaning})


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode: the search, its sizes, ranking, output length limit and sampling settings.

    Frozen and hashable: the server decodes the jobs with equal options together.

    Each option's meaning is its declaration's ``help`` below: the tools' ``--help``, the
    server's request schema and compare.py's options describe it with that
    (:func:`described_options`).

    Raises:
        ValueError: one line naming the option, for a value out of range here or in the
            search's own check.
    """

    search: str = option(
        "beam", "beam: beam search (greedy at beam_size 1; grid beam search where a sentence "
        "has constraints or terms) | sample: draw nbest translations from the model (e.g. for "
        "back-translation) | NAME: one registered in code (seq2seq.inference.searches)")
    beam_size: int = option(5, "beams per sentence; 1: greedy search")
    nbest: int = option(1, "translations returned per sentence, best first (<= beam_size with "
                           "search=beam; any number with search=sample)")
    length_penalty: float = option(
        1.0, "GNMT alpha; 0: rank by summed log-probability (a CTranslate2 folder searches with "
             "its own length ** alpha, then ranks by GNMT: docs/export.md)")
    max_len_a: float = option(1.5, "output length limit: floor(a * source length + b) pieces "
                                   "(EOS not counted; the source length counts its EOS)")
    max_len_b: float = option(10.0, "the b of the output length limit (see max_len_a)")
    temperature: float = option(1.0, "search=sample: the log-probabilities are divided by this "
                                     "(below 1: sharper, above 1: flatter)")
    top_k: int = option(0, "search=sample: draw among the k most probable pieces only (0: all; "
                           "1: greedy)")
    top_p: float = option(1.0, "search=sample: nucleus sampling, among the fewest most probable "
                               "pieces whose probability reaches p (1: all)")
    epsilon: float = option(0.0, "search=sample: leave out pieces less probable than this (the "
                                 "most probable always kept)")
    seed: int | None = option(
        None, "search=sample: seed of the draws, in [0, 2**63) (the same input and options give "
              "the same samples; a CTranslate2 folder: a run whose first draws are seeded, "
              "docs/export.md); null: other draws each time")

    def __post_init__(self) -> None:
        search = self.search_method
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be at least 1, got {self.beam_size}")
        if self.nbest < 1 or (search.nbest_within_beam and self.nbest > self.beam_size):
            bound = f"between 1 and beam_size ({self.beam_size})" if search.nbest_within_beam \
                else "at least 1"
            raise ValueError(f"nbest must be {bound}, got {self.nbest}")
        search.check(self)
        if not (self.length_penalty >= 0 and math.isfinite(self.length_penalty)):
            raise ValueError(f"length_penalty must be a number >= 0, got {self.length_penalty}")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a positive number, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be 0 (all pieces) or more, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.epsilon < 1:
            raise ValueError(f"epsilon must be in [0, 1), got {self.epsilon}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")

    @property
    def search_method(self) -> Search:
        """The registered search ``search`` names (a one-line ValueError for another name)."""
        from seq2seq.inference.searches import search_named  # torch: not for the types below

        return search_named(self.search)

    @property
    def label(self) -> str:
        """How reports and file names call the search: ``beam 5``, ``sample``."""
        return self.search_method.label(self)

    @property
    def seeded(self) -> bool:
        """Whether the draws depend on the seed (a seeded sample): such a call is decoded
        alone, its draws depending on the sentences drawn together."""
        return self.search_method.draws and self.seed is not None

    @classmethod
    def of(cls, values) -> DecodeOptions:
        """The options that ``values`` (a mapping: a config, a request's fields) has, the
        defaults for the others."""
        return cls(**{field.name: values[field.name] for field in fields(cls)
                      if field.name in values})

    def check_phrases(self) -> None:
        """A one-line ValueError where phrases are asked of a search that cannot force them."""
        if not self.search_method.phrases:
            raise ValueError(f"constraints and terms need search=beam "
                             f"({self.search_method.no_phrases})")


def check_phrase_count(phrases: Sequence[str], where: str) -> None:
    """A one-line ValueError, naming ``where``, for more phrases than one sentence may ask
    (:data:`~seq2seq.inference.constraints.MAX_PHRASES`)."""
    from seq2seq.inference.constraints import MAX_PHRASES

    if len(phrases) > MAX_PHRASES:
        raise ValueError(f"{where}: {len(phrases)} phrases; at most {MAX_PHRASES} per sentence")


def option_types() -> dict[str, Any]:
    """Each option's type, by name (what the tools check a config's values against)."""
    return typing.get_type_hints(DecodeOptions)


def option_defaults() -> dict[str, Any]:
    """Each option's default, by name, in declaration order (the decoding group's options)."""
    return {option.name: option.default for option in fields(DecodeOptions)}


def described_options() -> dict[str, tuple[Any, Any, str]]:
    """Each option's (type, default, help), by name, in declaration order."""
    types = option_types()
    return {option.name: (types[option.name], option.default, option.metadata["help"])
            for option in fields(DecodeOptions)}
