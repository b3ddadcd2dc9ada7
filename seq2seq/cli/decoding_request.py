"""The options that translate.py, evaluate.py and serve.py share: how to decode, and what steers
each sentence's translation (``constraints=`` and ``prefix=`` files, one line per input line,
and a ``terms=`` glossary), made into one :class:`DecodingRequest` before a model loads.

Everything a file can get wrong is refused before the first sentence is decoded, as one line
naming the file and its line: a line count other than the input's (when the input's is known
beforehand), a phrase or prefix with a piece the model's target vocabulary lacks, too many
phrases for one sentence.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from seq2seq.cli.common import check_types, fail, set_up_decoding, translator_options
from seq2seq.inference.decode_options import option_types

if TYPE_CHECKING:
    from seq2seq.inference.decode_options import DecodeOptions
    from seq2seq.inference.glossary import Glossary

# The types of the options evaluate.py, translate.py and serve.py share, where a tool's config
# has them (its YAML documents each): the translator's settings, how to decode (DecodeOptions'
# own), and what steers each sentence.
OPTION_TYPES: dict[str, Any] = {
    "device": str, "num_threads": int | None, "precision": str, "quantize": str,
    "max_source_length": int, "batch.max_tokens": int, "chunk_lines": int,
    "shortlist": str | None, **option_types(),
    "constraints": str | None, "prefix": str | None, "terms": str | None,
    "terms_ignore_case": bool,
}
# Lines a check reads (and encodes) at a time.
CHECK_CHUNK_LINES = 1000


def check_config(cfg: DictConfig) -> None:
    """Exit with a one-line error naming the key where an option has the wrong type, or a file
    option names no file; before torch loads (the value ranges are :class:`DecodeOptions
    <seq2seq.inference.decode_options.DecodeOptions>`' checks, in :meth:`DecodingRequest.of`)."""
    check_types(cfg, OPTION_TYPES)
    for key in ("constraints", "prefix", "terms"):
        if cfg.get(key) and not Path(cfg[key]).is_file():
            fail(f"{key} file not found: {cfg[key]}")


def changed_options(cfg: DictConfig, keys: Sequence[str]) -> list[tuple[str, Any]]:
    """``(key, value)`` of each of the decoding group's ``keys`` whose value in ``cfg`` is not
    the group's default (DecodeOptions' or the translator's settings')."""
    from seq2seq import CONFIG_DIR
    from seq2seq.inference.decode_options import option_defaults

    group = OmegaConf.load(CONFIG_DIR / "decoding" / "default.yaml")
    del group["defaults"]
    defaults = OmegaConf.merge(option_defaults(), group)
    return [(key, value) for key in keys
            if (value := OmegaConf.select(cfg, key)) != OmegaConf.select(defaults, key)]


def refuse_unused(cfg: DictConfig, keys: Sequence[str], reason: str) -> None:
    """Exit with ``error: KEY=VALUE: REASON`` for the first of the decoding group's ``keys``
    that ``cfg`` changes from the group's default: an option the tool cannot use."""
    for key, value in changed_options(cfg, keys)[:1]:
        fail(f"{key}={value}: {reason}")


def start_decoding(cfg: DictConfig) -> DecodingRequest:
    """What every decoding tool does once its own options are checked: set up torch for
    decoding (:func:`~seq2seq.cli.common.set_up_decoding`) and make the request, exiting with a
    one-line error on a value out of range or an unreadable shortlist or glossary."""
    from seq2seq.data.text_files import DataError

    set_up_decoding(cfg.get("num_threads"))
    try:
        return DecodingRequest.of(cfg)
    except (DataError, ValueError) as error:
        fail(error)


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


class LineFile:
    """A file read one line per input line (``constraints=``, ``prefix=``), beside the input."""

    def __init__(self, key: str, path: str | Path) -> None:
        from seq2seq.data.text_files import iter_lines

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
    from seq2seq.data.text_files import iter_lines
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


@dataclass(frozen=True)
class DecodingRequest:
    """What a decoding tool's config asks, made in one pass before a model loads: how to
    decode (:class:`~seq2seq.inference.decode_options.DecodeOptions`), the translator's
    settings, the ``terms=`` glossary (read), and the ``constraints=`` and ``prefix=`` files
    (read beside the input once the model's vocabulary can check them). translate.py,
    evaluate.py and serve.py each make one and use it for every model they load."""

    options: DecodeOptions
    translator_settings: dict[str, Any]
    glossary: Glossary | None = None
    line_files: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, cfg: DictConfig) -> DecodingRequest:
        """The request ``cfg`` makes (its option types checked by :func:`check_config` first).

        Raises:
            ValueError: naming the option or the file: a value out of range, an unreadable
                shortlist (ShortlistError) or glossary (GlossaryError).
        """
        from seq2seq.inference.decode_options import DecodeOptions
        from seq2seq.inference.glossary import Glossary

        glossary = (Glossary.load(cfg.terms, ignore_case=bool(cfg.get("terms_ignore_case")))
                    if cfg.get("terms") else None)
        return cls(DecodeOptions.of(cfg), translator_options(cfg), glossary,
                   {key: str(cfg[key]) for key in ("constraints", "prefix") if cfg.get(key)})

    def open(self, paths: Sequence[str | Path], device: str):
        """The model at ``paths`` (:func:`~seq2seq.inference.runtimes.open_model`, whose errors
        it raises) with this request's translator settings, checked against what the request
        asks (:meth:`check`)."""
        from seq2seq.inference.runtimes import open_model

        opened = open_model(list(paths), device, **self.translator_settings)
        self.check(opened.translator)
        return opened

    def check(self, translator) -> None:
        """A one-line ValueError where ``translator`` cannot do what is asked: the search, or
        phrases (``constraints=``, ``terms=``) it cannot force, before any file is read; then
        a glossary target term its vocabulary cannot write."""
        translator.check(self.options,
                         phrases="constraints" in self.line_files or self.glossary is not None)
        if self.glossary is not None:
            entries = self.glossary.entries
            check_writable(translator, [entry.target for entry in entries],
                           [f"{self.glossary.name}: line {entry.line}: target term"
                            for entry in entries])

    def guidance(self, translator, *, input_lines: int | None) -> SentenceGuidance:
        """The sentences' guidance, every file checked first against ``translator``'s
        vocabulary (:func:`check_line_file`, whose errors it raises); ``input_lines``: the
        input's line count where known."""
        for key, path in self.line_files.items():
            check_line_file(key, path, translator, input_lines)
        return SentenceGuidance(**{key: LineFile(key, path)
                                   for key, path in self.line_files.items()},
                                glossary=self.glossary)
