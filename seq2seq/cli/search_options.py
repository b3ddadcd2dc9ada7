"""The options that translate.py, evaluate.py and serve.py share: the search and its
sampling settings, and what steers each sentence's translation (``constraints=`` and
``prefix=`` files, one line per input line, and a ``terms=`` glossary), read alongside the input.

Everything a file can get wrong is refused before the first sentence is decoded, as one line
naming the file and its line: a line count other than the input's (when the input's is known
beforehand), a phrase or prefix with a piece the model's target vocabulary lacks, too many
phrases for one sentence.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from seq2seq.cli.common import fail
from seq2seq.config_types import ConfigError, check_value

# The types of the options below, where a tool's config has them (its YAML documents each;
# the search's own are DecodeOptions', checked with the others by check_options).
SEARCH_OPTION_TYPES: dict[str, Any] = {
    "constraints": str | None, "prefix": str | None, "terms": str | None,
    "terms_ignore_case": bool,
}
# Lines a check reads (and encodes) at a time.
CHECK_CHUNK_LINES = 1000


def check_search_options(cfg: DictConfig) -> None:
    """Exit with a one-line error on an option of the wrong type or a file option naming no
    file; before torch loads (the value ranges are :class:`DecodeOptions
    <seq2seq.inference.decode_options.DecodeOptions>`' checks)."""
    for key, annotation in SEARCH_OPTION_TYPES.items():
        if key in cfg:
            try:
                check_value(cfg[key], annotation, key)
            except ConfigError as error:
                fail(error)
    for key in ("constraints", "prefix", "terms"):
        if cfg.get(key) and not Path(cfg[key]).is_file():
            fail(f"{key} file not found: {cfg[key]}")


def decode_options(cfg: DictConfig):
    """The :class:`~seq2seq.inference.decode_options.DecodeOptions` of the config (its search,
    beam, n-best, length penalty, limits and sampling options; the defaults for those it lacks).

    Raises:
        ValueError: on a value out of range, naming the option.
    """
    from seq2seq.inference.decode_options import DecodeOptions

    return DecodeOptions.of(cfg)


def check_request(cfg: DictConfig, translator, options) -> None:
    """A one-line ValueError where ``options``, with the phrases the config asks for
    (``constraints=``, ``terms=``), ask what the translator cannot do (phrases with sampling,
    or a runtime that cannot force them), before any file is read."""
    translator.check(options, phrases=bool(cfg.get("constraints") or cfg.get("terms")))


def phrases_of(line: str) -> list[str]:
    """The phrases of one line of a constraints file: TAB-separated, each once, blank ones (a
    trailing TAB) left out."""
    phrases = (" ".join(field.split()) for field in line.split("\t"))
    return list(dict.fromkeys(phrase for phrase in phrases if phrase))


def check_writable(translator, texts: Sequence[str], labels: Sequence[str]) -> None:
    """Raise the Translator's one-line ValueError, prefixed with its label, for the first text
    the model's target vocabulary cannot write (one tokenizer call when all can)."""
    try:
        translator.target_ids(list(texts), "phrase")
    except ValueError:
        for text, label in zip(texts, labels, strict=True):
            translator.target_ids([text], label)
        raise


def load_terms(cfg: DictConfig, translator, *, name: str = ""):
    """The ``terms=FILE`` glossary, its every target term checked against ``translator``'s
    vocabulary, or None without one.

    Raises:
        GlossaryError: (a ValueError) on a malformed file or a target term the model cannot
            write.
    """
    if not cfg.get("terms"):
        return None
    from seq2seq.inference.glossary import Glossary

    glossary = Glossary.load(cfg.terms, ignore_case=bool(cfg.get("terms_ignore_case", False)))
    targets = [entry.target for entry in glossary.entries]
    labels = [f"{glossary.name}: line {entry.line}: target term" for entry in glossary.entries]
    check_writable(translator, targets, labels)
    return glossary


class LineFile:
    """A file read one line per input line (``constraints=``, ``prefix=``), beside the input."""

    def __init__(self, key: str, path: str | Path) -> None:
        from seq2seq.data.corpus import iter_lines

        self.key, self.path = key, Path(path)
        self._lines: Iterator[str] = iter_lines(self.path)
        self.count = 0

    def take(self, count: int) -> list[str]:
        """Its next ``count`` lines; a ValueError when it has fewer."""
        lines = list(islice(self._lines, count))
        self.count += len(lines)
        if len(lines) < count:
            raise ValueError(f"{self.key} file {self.path} has {self.count} lines but the input "
                             "has more: give one line per input line")
        return lines

    def finish(self) -> None:
        """A ValueError when lines are left once the input has ended."""
        if next(self._lines, None) is not None:
            raise ValueError(f"{self.key} file {self.path} has more lines than the input "
                             f"({self.count}): give one line per input line")


def check_line_file(key: str, path: str | Path, translator, input_lines: int | None) -> None:
    """Read a ``constraints=`` or ``prefix=`` file through once: every phrase or prefix
    writable, at most the constraint search's phrases a line, as many lines as the input's
    ``input_lines`` (None: not known yet; counted as the input is read).

    Raises:
        ValueError: naming the file and the line; DataError on an unreadable file.
    """
    from seq2seq.data.corpus import iter_lines
    from seq2seq.inference.decode_options import check_phrase_count

    all_lines, count = iter_lines(Path(path)), 0
    while lines := list(islice(all_lines, CHECK_CHUNK_LINES)):
        first, count = count + 1, count + len(lines)
        if key == "prefix":
            texts = [line for line in lines if line]
            labels = [f"{path}: line {first + i}: prefix" for i, line in enumerate(lines) if line]
        else:
            texts, labels = [], []
            for number, line in enumerate(lines, start=first):
                phrases = phrases_of(line)
                check_phrase_count(phrases, f"{path}: line {number}")
                texts += phrases
                labels += [f"{path}: line {number}: constraint"] * len(phrases)
        check_writable(translator, texts, labels)
    if input_lines is not None and count != input_lines:
        raise ValueError(f"{key} file {path} has {count} lines but the input has "
                         f"{input_lines}: give one line per input line")


class SentenceGuidance:
    """The prefixes and constraints of the input's sentences, chunk by chunk: from the
    ``prefix=`` and ``constraints=`` files (read in step with the input) and the glossary."""

    def __init__(self, *, constraints: LineFile | None = None, prefix: LineFile | None = None,
                 glossary=None) -> None:
        self.constraints, self.prefix, self.glossary = constraints, prefix, glossary
        self.lines_read = 0

    @classmethod
    def from_config(cls, cfg: DictConfig, translator, *,
                    input_lines: int | None) -> SentenceGuidance:
        """What ``cfg`` asks for, every file checked first (:func:`check_line_file`,
        :func:`load_terms`); ``input_lines``: the input's line count where known.

        Raises:
            ValueError: (a GlossaryError for the glossary) naming the file and the line;
                DataError on an unreadable file.
        """
        files = {}
        for key in ("constraints", "prefix"):
            if cfg.get(key):
                check_line_file(key, cfg[key], translator, input_lines)
                files[key] = LineFile(key, cfg[key])
        return cls(**files, glossary=load_terms(cfg, translator))

    @property
    def active(self) -> bool:
        return any(part is not None for part in (self.constraints, self.prefix, self.glossary))

    def for_lines(self, lines: Sequence[str]) -> dict[str, list]:
        """``translate``'s ``prefixes`` and ``constraints`` for these next input lines (only
        those asked for)."""
        from seq2seq.inference.decode_options import check_phrase_count

        options: dict[str, list] = {}
        first, self.lines_read = self.lines_read + 1, self.lines_read + len(lines)
        if self.prefix is not None:
            options["prefixes"] = self.prefix.take(len(lines))
        if self.constraints is not None or self.glossary is not None:
            found = ([phrases_of(line) for line in self.constraints.take(len(lines))]
                     if self.constraints is not None else [[] for _ in lines])
            if self.glossary is not None:
                found = [list(dict.fromkeys(own + terms)) for own, terms in
                         zip(found, self.glossary.constraints_for(lines), strict=True)]
            for number, phrases in enumerate(found, start=first):
                # The files' own lines were checked already: this counts the glossary's terms.
                check_phrase_count(phrases, f"input line {number} with the glossary's terms")
            options["constraints"] = found
        return options

    def finish(self) -> None:
        """A ValueError when a file has lines left over once the input has ended."""
        for file in (self.constraints, self.prefix):
            if file is not None:
                file.finish()
