"""``python translate.py checkpoint=PATH [overrides]`` / ``seq2seq-translate``: translate text.

Reads one sentence a line (stdin, ``input=FILE`` or ``text="..."``) and writes one
translation a line (stdout or ``output=FILE``), in input order. Stdout carries the
translations and nothing else: every log line goes to stderr, and Hydra writes no
``outputs/`` or ``.hydra/`` folder (see ``seq2seq/configs/translate.yaml``). Every error is one
``error: ...`` line on stderr, exit status 1, no traceback.

Examples, output formats (n-best lines, ``-inf`` fillers), interactive use, ensembles,
shortlists, terminology, prefixes and sampling: docs/evaluate-translate.md.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from omegaconf import DictConfig, OmegaConf

from seq2seq.atomic import atomic_write
from seq2seq.cli.app import hydra_tool
from seq2seq.cli.common import checkpoint_paths, fail, require_checkpoint_files
from seq2seq.cli.decoding_request import check_config, start_decoding
from seq2seq.console import count_bar
from seq2seq.data.text_files import one_line

if TYPE_CHECKING:
    from seq2seq.inference.translator import Translation

log = logging.getLogger("seq2seq.translate")
# Startup counts from here: Hydra's config composition and the torch import come later.
MODULE_LOADED = time.perf_counter()


def _chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    iterator = iter(lines)
    while chunk := list(islice(iterator, size)):
        yield chunk


def format_translations(n_best: Sequence[Translation], *, nbest: int) -> list[str]:
    """The output lines of one input sentence (docs/evaluate-translate.md, "n-best")."""
    if nbest == 1:
        return [one_line(n_best[0].text)]
    lines = [f"{t.score:.4f}\t{one_line(t.text)}" for t in n_best[:nbest]]
    return lines + ["-inf\t"] * (nbest - len(lines))


class _Writer:
    """Writes output lines and the optional attention plots, numbering input lines."""

    def __init__(self, *, stream: TextIO, nbest: int, plot_dir: Path | None) -> None:
        self.stream = stream
        self.nbest = nbest
        self.plot_dir = plot_dir
        self.count = 0

    def write(self, translations: Sequence[Sequence[Translation]]) -> None:
        for n_best in translations:
            self.count += 1
            self.stream.write(
                "".join(line + "\n" for line in format_translations(n_best, nbest=self.nbest))
            )
            if self.plot_dir is not None and n_best[0].attention is not None:
                self._plot(n_best[0])
        # Flushing after each chunk lets a pipeline downstream (or a terminal) see it now.
        self.stream.flush()

    def _plot(self, best: Translation) -> None:
        from seq2seq.inference.attention_plot import save_attention_plot

        path = self.plot_dir / f"line{self.count:06d}.png"
        save_attention_plot(
            path,
            best.attention,
            best.source_pieces + ["</s>"],
            best.target_pieces + ["</s>"],
            title=f"line {self.count} (score {best.score:.3f})",
        )


def _typed_lines(label: str) -> Iterator[str]:
    """The lines typed on a terminal, each after a prompt on stderr."""
    print(f"Type a sentence and Enter to translate it ({label}); Ctrl-D to quit.",
          file=sys.stderr, flush=True)
    while True:
        print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:  # end of input
            print(file=sys.stderr)
            return
        yield line.rstrip("\r\n")


def run(cfg: DictConfig) -> int:
    """Translate as configured; returns the number of input lines translated."""
    started = MODULE_LOADED
    check_config(cfg)
    if OmegaConf.is_missing(cfg, "checkpoint") or not cfg.checkpoint:
        fail("no checkpoint given: add checkpoint=PATH")
    if cfg.text is not None and cfg.input is not None:
        fail("give either text=... or input=FILE, not both")
    if cfg.chunk_lines < 1:
        fail(f"chunk_lines must be positive, got {cfg.chunk_lines}")
    if cfg.input is not None and not Path(cfg.input).is_file():
        fail(f"input file not found: {cfg.input}")
    paths = checkpoint_paths(cfg.checkpoint)
    require_checkpoint_files(paths)
    # torch loads from here on: a bad option or a mistyped path above is refused without it.
    from seq2seq.checkpoint import CheckpointError
    from seq2seq.data.text_files import DataError, decode_lines, iter_lines

    request = start_decoding(cfg)
    options = request.options
    try:
        # A Translator, or a CTranslate2 folder's own translator (the same interface).
        translator = request.open(paths, cfg.device).translator
    except (CheckpointError, DataError, ValueError) as error:
        fail(error)
    # Line counts compared before decoding where the input's is known (a stream: as it is read).
    # (A second read of the input file: only for a per-line file or a progress bar.)
    input_lines = None
    try:
        if cfg.text is not None:
            input_lines = 1
        elif cfg.input is not None and (request.line_files or sys.stderr.isatty()):
            from seq2seq.data.corpora import line_count

            input_lines = line_count(Path(cfg.input))
        guidance = request.guidance(translator, input_lines=input_lines)
    except (DataError, ValueError) as error:
        fail(error)
    startup = time.perf_counter() - started
    log.info("loaded %s on %s in %.1fs", " + ".join(paths), translator.device, startup)
    if translator.shortlist is not None:
        log.info("output vocabulary restricted by %s", translator.shortlist.name)

    plot_dir = Path(cfg.attention_plot) if cfg.attention_plot else None
    chunk_lines = cfg.chunk_lines
    if cfg.text is not None:
        lines: Iterable[str] = [str(cfg.text)]
    elif cfg.input is not None:
        lines = iter_lines(Path(cfg.input))
    elif sys.stdin.isatty():  # each line translated as it is typed
        lines, chunk_lines = _typed_lines(options.label), 1
    else:  # split at "\n" only, like the files; a line not in UTF-8 is a DataError naming it
        lines = decode_lines(sys.stdin.buffer, "<stdin>")

    try:
        with ExitStack() as stack:
            if cfg.output is not None:
                # All or nothing: a run stopped half-way leaves no partial output file.
                stream: TextIO = stack.enter_context(atomic_write(cfg.output, mode="w"))
            else:
                # UTF-8 and "\n" whatever the locale, so the output matches the files' encoding.
                if hasattr(sys.stdout, "reconfigure"):
                    sys.stdout.reconfigure(encoding="utf-8", newline="\n")
                stream = sys.stdout
            writer = _Writer(stream=stream, nbest=cfg.nbest, plot_dir=plot_dir)
            decode_seconds = 0.0
            # A file of over 1,000 lines gets a bar with its ETA (stderr, terminal only).
            total = input_lines if cfg.input is not None and sys.stderr.isatty() else None
            bar = stack.enter_context(count_bar(
                total, description="translating", unit=" lines",
                enabled=None if total is not None and total > 1000 else False))
            for chunk in _chunks(lines, chunk_lines):
                chunk_started = time.perf_counter()
                writer.write(translator.translate(chunk, options,
                                                  return_attention=plot_dir is not None,
                                                  **guidance.for_lines(chunk)))
                decode_seconds += time.perf_counter() - chunk_started
                bar.update(len(chunk))
            guidance.finish()
            stream.flush()
    except (DataError, ValueError) as error:
        fail(error)
    except OSError as error:
        if isinstance(error, BrokenPipeError):
            raise
        fail(f"cannot write {cfg.output or 'the output'}: {error.strerror or error}")
    total = time.perf_counter() - started
    log.info(
        "translated %d lines: %.1fs decoding, %.1fs in total (startup %.1fs)",
        writer.count,
        decode_seconds,
        total,
        startup,
    )
    return writer.count


def run_as_filter(cfg: DictConfig) -> None:
    """:func:`run`, ended as a Unix filter ends: quietly when the reader goes away, with 130 on
    Ctrl-C."""
    try:
        run(cfg)
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, like other Unix filters.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        sys.exit(130)


# ``python translate.py``: see the module docstring (``--help`` lists the options).
main = hydra_tool(run_as_filter, config_name="translate", summary=__doc__.splitlines()[0],
                  literal_keys=("text",))


if __name__ == "__main__":
    main()
