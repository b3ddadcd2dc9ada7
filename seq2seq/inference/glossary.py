"""Terminology: a glossary file of source terms and their required translations.

The file's format and the matching rules are docs/evaluate-translate.md's (``terms=FILE``);
surrounding spaces of a term are not part of it. :meth:`Glossary.constraints_for` turns
sentences into the target terms each translation must contain, which the Translator enforces
as constraints (:mod:`seq2seq.inference.constraints`).

Typical use::

    glossary = Glossary.load("terms.tsv")
    translator.translate(sentences, constraints=glossary.constraints_for(sentences))
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


class GlossaryError(ValueError):
    """A glossary file that cannot be read or used; the message is one line naming it."""


@dataclass(frozen=True)
class Entry:
    """One line of a glossary: ``source`` is translated as ``target`` (``line``: 1-based)."""

    source: str
    target: str
    line: int


def term_pattern(term: str, *, ignore_case: bool = False) -> re.Pattern[str]:
    """A pattern finding ``term`` as whole words: not preceded or followed by a letter, digit
    or underscore, its words separated by any whitespace."""
    words = r"\s+".join(re.escape(word) for word in term.split())
    return re.compile(rf"(?<!\w){words}(?!\w)", re.IGNORECASE if ignore_case else 0)


@dataclass
class Glossary:
    """Source terms and the target terms a translation of them must contain.

    Attributes:
        entries: in file order.
        ignore_case: match source terms regardless of case (the target term is produced as
            written either way).
        name: what error messages call the glossary (its path).
    """

    entries: Sequence[Entry]
    ignore_case: bool = False
    name: str = "glossary"
    _patterns: list[re.Pattern[str]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._patterns = [term_pattern(e.source, ignore_case=self.ignore_case)
                          for e in self.entries]

    @classmethod
    def load(cls, path: str | Path, *, ignore_case: bool = False) -> Glossary:
        """Read a glossary file: UTF-8, plain or gzip, its lines as :meth:`parse` reads them.

        Raises:
            GlossaryError: naming the file (and the line), for one that cannot be read or a
                line :meth:`parse` refuses.
        """
        from seq2seq.data.text_files import DataError, iter_lines

        try:
            return cls.parse(iter_lines(Path(path)), name=str(path), ignore_case=ignore_case)
        except DataError as error:
            raise GlossaryError(f"terms file: {error}") from None

    @classmethod
    def parse(cls, lines: Iterable[str], *, name: str = "glossary",
              ignore_case: bool = False) -> Glossary:
        """A glossary from the lines of a file (without terminators); see :meth:`load`."""
        entries: list[Entry] = []
        first_line: dict[str, int] = {}
        for number, line in enumerate(lines, start=1):
            if not line.strip() or line.startswith("#"):
                continue
            fields = line.split("\t")
            if len(fields) != 2:
                raise GlossaryError(
                    f"{name}: line {number}: expected SOURCE<TAB>TARGET, found "
                    f"{len(fields) - 1} tabs")
            source, target = (" ".join(text.split()) for text in fields)
            if not source or not target:
                side = "source" if not source else "target"
                raise GlossaryError(f"{name}: line {number}: the {side} term is empty")
            # Two targets for one source would both be forced into every translation.
            key = source.casefold() if ignore_case else source
            if key in first_line:
                raise GlossaryError(f"{name}: line {number}: source term {source!r} is already "
                                    f"given on line {first_line[key]}")
            first_line[key] = number
            entries.append(Entry(source, target, number))
        return cls(entries, ignore_case=ignore_case, name=name)

    def constraints_for(self, sentences: Sequence[str]) -> list[list[str]]:
        """Per sentence, the target terms of the source terms it contains as whole words, in
        glossary order, each once."""
        folded = [s.casefold() for s in sentences] if self.ignore_case else sentences
        found: list[list[str]] = []
        for sentence, haystack in zip(sentences, folded, strict=True):
            terms: dict[str, None] = {}  # ordered, without repeats
            for entry, pattern in zip(self.entries, self._patterns, strict=True):
                needle = entry.source.split()[0]
                # A substring test first: most terms are absent from most sentences.
                if (needle.casefold() if self.ignore_case else needle) in haystack \
                        and pattern.search(sentence):
                    terms[entry.target] = None
            found.append(list(terms))
        return found

    def __len__(self) -> int:
        return len(self.entries)
