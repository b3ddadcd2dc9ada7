"""Reading parallel text corpora: plain or gzip-compressed UTF-8, one sentence a line.

Everything here streams: files are read line by line (or in chunks of lines), never whole,
so corpora larger than memory can be checked and encoded.
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Iterable, Iterator
from itertools import zip_longest
from pathlib import Path
from typing import BinaryIO

GZIP_MAGIC = b"\x1f\x8b"
DEFAULT_CHUNK_LINES = 10_000


class DataError(Exception):
    """A problem with the data or its configuration that the user must fix.

    The message is one readable line (it is printed as is by the command line tools), naming
    the file(s) involved.
    """


def open_binary(path: Path) -> BinaryIO:
    """Opens a corpus file for reading bytes, decompressing it when it is gzip data.

    Compression is detected from the content rather than the suffix, so a gzip file without
    `.gz` (or a plain file named `.gz`) still reads correctly.

    Raises:
        DataError: If the file does not exist or cannot be opened.
    """
    path = Path(path)
    try:
        with open(path, "rb") as probe:
            compressed = probe.read(2) == GZIP_MAGIC
        if compressed:
            # A BufferedReader around the GzipFile: its readline is much faster than GzipFile's.
            return io.BufferedReader(gzip.open(path, "rb"), buffer_size=1 << 20)
        return open(path, "rb", buffering=1 << 20)
    except FileNotFoundError:
        raise DataError(f"file not found: {path}") from None
    except IsADirectoryError:
        raise DataError(f"expected a file, found a directory: {path}") from None
    except OSError as error:
        raise DataError(f"cannot open {path}: {error.strerror or error}") from None


def _decode_line(raw: bytes, path: str | Path, line_number: int) -> str:
    """Decodes one raw line (terminator included) to text without its line terminator."""
    if raw.endswith(b"\n"):
        raw = raw[:-1]
        if raw.endswith(b"\r"):
            raw = raw[:-1]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataError(
            f"{path}: line {line_number} is not valid UTF-8 "
            f"(byte 0x{raw[error.start]:02x} at column {error.start + 1})"
        ) from None
    # A byte-order mark is not part of the first sentence.
    if line_number == 1 and text.startswith("\ufeff"):
        text = text[1:]
    return text


def _raw_lines(file: BinaryIO, path: Path) -> Iterator[bytes]:
    """Yields the raw lines of an open file, turning decompression errors into DataError."""
    try:
        yield from file
    except (gzip.BadGzipFile, EOFError, zlib.error) as error:
        raise DataError(f"{path}: corrupt or truncated gzip data ({error})") from None
    except OSError as error:
        raise DataError(f"cannot read {path}: {error.strerror or error}") from None


def iter_lines(path: Path) -> Iterator[str]:
    """Yields the lines of a corpus file as text, without line terminators, in file order
    (empty lines included).

    Raises:
        DataError: If the file is missing, unreadable or not valid UTF-8 (the message gives
            the 1-based line number).
    """
    path = Path(path)
    with open_binary(path) as file:
        yield from decode_lines(_raw_lines(file, path), path)


def decode_lines(raw_lines: Iterable[bytes], name: str | Path) -> Iterator[str]:
    """Raw lines (stdin's, a file's) as text without terminators; ``name`` names the stream
    in the DataError of a line that is not valid UTF-8 (with its 1-based number)."""
    for line_number, raw in enumerate(raw_lines, start=1):
        yield _decode_line(raw, name, line_number)


def one_line(text: str) -> str:
    """A text with its line breaks made spaces: a sentence is one line, to the model and in a
    file of one sentence a line (a stray break would shift every line after it)."""
    return " ".join(text.splitlines())


def read_lines(path: Path) -> list[str]:
    """Reads a whole (small) corpus file, e.g. references to score against, without line
    terminators; raises DataError as `iter_lines` does."""
    return list(iter_lines(path))


def line_count_error(src_path: Path, src_count: int, tgt_path: Path, tgt_count: int) -> DataError:
    return DataError(
        f"source and target have different line counts: {src_path} has {src_count} lines, "
        f"{tgt_path} has {tgt_count} lines"
    )


def iter_parallel_chunks(
    src_path: Path, tgt_path: Path, *, chunk_lines: int = DEFAULT_CHUNK_LINES
) -> Iterator[tuple[list[str], list[str]]]:
    """Streams a parallel corpus as chunks of aligned sentence pairs.

    The line counts are checked as the files are read: when one file ends before the other,
    the rest of the longer one is counted so the error can name both counts. Each chunk is
    (source sentences, target sentences) of `chunk_lines` pairs (the last may be shorter).

    Raises:
        DataError: On a missing file, invalid UTF-8 or different line counts.
    """
    src_path, tgt_path = Path(src_path), Path(tgt_path)
    if chunk_lines < 1:
        raise ValueError(f"chunk_lines must be positive, got {chunk_lines}")
    with open_binary(src_path) as src_file, open_binary(tgt_path) as tgt_file:
        src_raw_lines = _raw_lines(src_file, src_path)
        tgt_raw_lines = _raw_lines(tgt_file, tgt_path)
        src_chunk: list[str] = []
        tgt_chunk: list[str] = []
        line_number = 0
        for line_number, (src_raw, tgt_raw) in enumerate(
            zip_longest(src_raw_lines, tgt_raw_lines), start=1
        ):
            if src_raw is None:
                tgt_count = line_number + sum(1 for _ in tgt_raw_lines)
                raise line_count_error(src_path, line_number - 1, tgt_path, tgt_count)
            if tgt_raw is None:
                src_count = line_number + sum(1 for _ in src_raw_lines)
                raise line_count_error(src_path, src_count, tgt_path, line_number - 1)
            src_chunk.append(_decode_line(src_raw, src_path, line_number))
            tgt_chunk.append(_decode_line(tgt_raw, tgt_path, line_number))
            if len(src_chunk) == chunk_lines:
                yield src_chunk, tgt_chunk
                src_chunk, tgt_chunk = [], []
        if src_chunk:
            yield src_chunk, tgt_chunk


def check_parallel(src_path: Path, tgt_path: Path) -> int:
    """Reads a whole parallel corpus once to check it, without keeping it; returns the number
    of sentence pairs, or raises DataError as `iter_parallel_chunks` does."""
    return sum(len(src) for src, _ in iter_parallel_chunks(src_path, tgt_path))
