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

import typing
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from seq2seq.inference.sampling import Sampling
    from seq2seq.inference.searches import Search


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode: the search, its sizes, ranking, output length limit and sampling settings.

    Frozen and hashable: the server decodes the jobs with equal options together.

    Attributes:
        search: a registered search's name (:mod:`seq2seq.inference.searches`): ``beam``
            (greedy search when ``beam_size`` is 1; grid beam search for sentences with
            constraints), ``sample`` (:mod:`seq2seq.inference.sampling`: ``nbest`` independent
            samples per sentence), or one registered by the caller.
        beam_size: beams per sentence; 1 is greedy search.
        nbest: translations returned per sentence (with ``search=beam``, at most ``beam_size``).
        length_penalty: GNMT alpha (0: rank by summed log-probability).
        max_len_a: output length limit ``floor(a * source length + b)`` pieces (EOS not
            counted; the source length counts its EOS).
        max_len_b: see ``max_len_a``.
        temperature, top_k, top_p, epsilon: how ``search=sample`` reshapes the distribution
            (:class:`~seq2seq.inference.sampling.Sampling`).
        seed: the seed of ``search=sample``'s draws, reset at every call (the same input and
            options give the same samples); None: other draws each time.

    Raises:
        ValueError: one line naming the option, for an unknown search, a non-positive size, a
            sampling setting out of range, or what the search's own check refuses
            (``nbest > beam_size`` with beam search).
    """

    search: str = "beam"
    beam_size: int = 5
    nbest: int = 1
    length_penalty: float = 1.0
    max_len_a: float = 1.5
    max_len_b: float = 10.0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    epsilon: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        search = self.search_method
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be at least 1, got {self.beam_size}")
        search.check(self)  # sampling draws nbest whatever the beam: beam search bounds it
        if self.nbest < 1:
            raise ValueError(f"nbest must be at least 1, got {self.nbest}")
        if self.length_penalty < 0:
            raise ValueError(f"length_penalty must be >= 0, got {self.length_penalty}")
        self.sampling.check()

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
    def sampling(self) -> Sampling:
        """The sampling settings (read by a search that draws: ``search=sample``)."""
        from seq2seq.inference.sampling import Sampling

        return Sampling(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                        epsilon=self.epsilon)

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
