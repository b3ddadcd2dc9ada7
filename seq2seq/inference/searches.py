"""The searches ``search=NAME`` reaches, registered by name: one class each.

A :class:`Search` turns one batch and its :class:`~seq2seq.inference.decode_options.DecodeOptions`
into hypotheses, through the one loop (:func:`~seq2seq.inference.search_loop.run_search`) with a
:class:`~seq2seq.inference.search_loop.Strategy` of its choice. Registering one makes it what
``search=NAME`` means everywhere options are given (``translate.py``, ``evaluate.py``, the
server's ``/v1/translate``, a library call) with no other edit: docs/evaluate-translate.md
("A search of your own") registers one.

Two come with the library: ``beam`` (greedy search at beam size 1, grid beam search for
sentences with constraints) and ``sample`` (:mod:`seq2seq.inference.sampling`). A runtime that
runs its own searches (a CTranslate2 folder) names those it has in
:attr:`~seq2seq.inference.translator.BaseTranslator.searches` and refuses the others.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from seq2seq.inference.constraints import Grid
from seq2seq.inference.sampling import sample_search
from seq2seq.inference.search_loop import Beam, Greedy, Hypothesis, run_search
from seq2seq.models.interfaces import DecodingModel


class Search:
    """A search ``search=NAME`` runs; subclass it and :func:`register_search` it.

    Attributes:
        name: what ``search=`` calls it (set by :func:`register_search`).
        phrases: whether it can force constraints and terms into every output.
        no_phrases: why not, in the one-line refusal of phrases.
        draws: whether it draws at random (``seed`` then counts, and a seeded call is decoded
            alone: its draws depend on the sentences drawn together).
        nbest_within_beam: whether its ``nbest`` best come from its beams, so at most
            ``beam_size`` (sampling draws any number).
    """

    name: ClassVar[str] = ""
    phrases: ClassVar[bool] = False
    no_phrases: ClassVar[str] = "this search cannot promise a phrase"
    draws: ClassVar[bool] = False
    nbest_within_beam: ClassVar[bool] = True

    def check(self, options) -> None:
        """A one-line ValueError, naming the option, where ``options`` are out of range for
        this search (what holds for every search, :class:`DecodeOptions` checks itself)."""

    def label(self, options) -> str:
        """How reports and file names call the search with ``options``: ``beam 5``."""
        return f"{self.name} {options.beam_size}"

    def rows(self, options) -> int:
        """The hypotheses a sentence keeps at once with ``options``: what a step costs, which
        the server bounds by its ``max_beam_size`` (a search that widens its beam says so)."""
        return options.beam_size

    def run(self, model: DecodingModel, src: Tensor, src_lengths: Tensor, options, *,
            generator: torch.Generator | None = None, prefixes: Tensor | None = None,
            constraints: Sequence[Sequence[Sequence[int]]] | None = None,
            return_attention: bool = False,
            output_ids: Tensor | None = None) -> list[list[Hypothesis]]:
        """One batch searched: per sentence, up to ``options.nbest`` hypotheses, best first.

        ``generator`` is the call's seeded generator (a seeded sample), else None;
        ``constraints`` (phrases of target ids) come only where :attr:`phrases`; the rest are
        :func:`~seq2seq.inference.search_loop.run_search`'s (:func:`loop_settings` passes them).
        """
        raise NotImplementedError


SEARCHES: dict[str, Search] = {}


def register_search(name: str) -> Callable[[type[Search]], type[Search]]:
    """A class decorator: ``search=name`` runs the class (one instance, shared)."""

    if not re.fullmatch(r"[A-Za-z0-9_]+", name):  # it names evaluate.py's files too
        raise ValueError(f"a search's name is letters, digits and _, got {name!r}")

    def register(cls: type[Search]) -> type[Search]:
        known = type(SEARCHES[name]) if name in SEARCHES else cls
        if (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"search {name!r} is registered already "
                             f"({known.__module__}.{known.__qualname__})")
        cls.name = name
        SEARCHES[name] = cls()
        return cls

    return register


def search_named(name: str) -> Search:
    """The registered search ``name``, or a one-line ValueError listing those there are."""
    try:
        return SEARCHES[name]
    except KeyError:
        raise ValueError(f"search must be one of {', '.join(SEARCHES)}, got {name!r}") from None


def loop_settings(options, *, prefixes: Tensor | None = None, return_attention: bool = False,
                  output_ids: Tensor | None = None, generator: torch.Generator | None = None,
                  constraints: Sequence[Sequence[Sequence[int]]] | None = None) -> dict[str, Any]:
    """:func:`~seq2seq.inference.search_loop.run_search`'s keyword arguments from ``options``
    (length limits, length penalty) and the batch (prefixes, attention, a shortlist's
    ``output_ids``). The ``generator`` and the ``constraints`` are the search's own to use
    (only a search with :attr:`Search.phrases` is given constraints)."""
    return {"max_len_a": options.max_len_a, "max_len_b": options.max_len_b,
            "length_penalty": options.length_penalty, "prefixes": prefixes,
            "return_attention": return_attention, "output_ids": output_ids}


@register_search("beam")
class BeamSearch(Search):
    """Beam search (:func:`~seq2seq.inference.search_loop.run_search`'s rules); greedy search at beam
    size 1 (the same output, less bookkeeping); grid beam search
    (:mod:`seq2seq.inference.constraints`) for a batch with constraints."""

    phrases = True

    def run(self, model, src, src_lengths, options, *, constraints=None, **guidance):
        if constraints is not None and any(constraints):
            strategy = Grid(constraints, options.beam_size, src.device)
        elif options.beam_size == 1:
            strategy = Greedy()
        else:
            strategy = Beam(options.beam_size)
        return run_search(model, src, src_lengths, strategy, nbest=options.nbest,
                          **loop_settings(options, **guidance))


@register_search("sample")
class SampleSearch(Search):
    """``nbest`` translations drawn from the model (:mod:`seq2seq.inference.sampling`); the
    beam size is not read."""

    no_phrases = "sampling cannot promise a phrase"
    draws = True
    nbest_within_beam = False

    def label(self, options) -> str:
        return "sample"

    def rows(self, options) -> int:
        return options.nbest  # one row a sample

    def run(self, model, src, src_lengths, options, *, generator=None, **guidance):
        return sample_search(model, src, src_lengths, options, generator=generator,
                             **loop_settings(options, **guidance))
