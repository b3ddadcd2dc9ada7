"""Encoded corpora as memory-mapped token arrays.

A side of a split is two `.npy` files: one flat array of all piece ids (no bos/eos) and an
int64 offsets array of length n + 1, sentence i being tokens[offsets[i]:offsets[i + 1]].
Both are opened with `np.load(mmap_mode="r")`, and a sentence's offsets and ids are read from
the files with `pread`, so a corpus costs almost no memory until read, DataLoader workers
share the operating system's page cache instead of copies, and reading sentences in random
order does not make the process resident in the whole file (see `TokenArray.load`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

TOKENS_SUFFIX = ".tokens.npy"
OFFSETS_SUFFIX = ".offsets.npy"


def _pread_elements(fd: int, mapped: np.memmap, first: int, count: int) -> np.ndarray:
    """Elements ``first .. first + count - 1`` of the file behind ``mapped``, in one ``pread``."""
    itemsize = mapped.itemsize
    data = os.pread(fd, count * itemsize, mapped.offset + first * itemsize)
    return np.frombuffer(data, dtype=mapped.dtype)


class TokenArray:
    """A sequence of token-id sentences stored as one flat array plus offsets."""

    def __init__(
        self,
        *,
        tokens: np.ndarray,
        offsets: np.ndarray,
        tokens_path: Path | None = None,
        offsets_path: Path | None = None,
    ) -> None:
        """Wraps existing arrays, laid out as the module docstring says.

        `tokens_path` and `offsets_path` name the files the arrays were mapped from, if any
        (pickling then reopens the files instead of copying the data into every DataLoader
        worker).

        Raises:
            ValueError: If the arrays are inconsistent.
        """
        if tokens.ndim != 1 or offsets.ndim != 1 or len(offsets) < 1:
            raise ValueError("tokens and offsets must be 1-D, offsets non-empty")
        if offsets[0] != 0 or offsets[-1] != len(tokens):
            raise ValueError(
                f"offsets must run from 0 to len(tokens)={len(tokens)}, "
                f"got {int(offsets[0])}..{int(offsets[-1])}"
            )
        self._tokens = tokens
        self._offsets = offsets
        self._tokens_path = tokens_path
        self._offsets_path = offsets_path
        self._lengths: np.ndarray | None = None
        self._tokens_fd: int | None = None
        self._offsets_fd: int | None = None
        self._open_files()

    def _open_files(self) -> None:
        """Read mapped files with ``pread`` rather than through their maps (see `load`)."""
        if (self._tokens_path is not None and self._offsets_path is not None
                and isinstance(self._tokens, np.memmap) and isinstance(self._offsets, np.memmap)
                and hasattr(os, "pread")):
            self._tokens_fd = os.open(self._tokens_path, os.O_RDONLY)
            self._offsets_fd = os.open(self._offsets_path, os.O_RDONLY)

    def __del__(self) -> None:
        for name in ("_tokens_fd", "_offsets_fd"):
            if getattr(self, name, None) is not None:
                os.close(getattr(self, name))
                setattr(self, name, None)

    @classmethod
    def load(cls, prefix: Path) -> TokenArray:
        """Memory-maps `<prefix>.tokens.npy` and `<prefix>.offsets.npy` read-only.

        Sentences and their offsets are then read from the files with ``pread``, not through
        the maps: training reads them in random order, and at each page it touches through a
        map the kernel maps the neighbouring cached pages too (fault-around), so on a large
        corpus the maps would grow resident with every step.

        Args:
            prefix: Path without the suffixes, e.g. `cache/ab12/train.src`.
        """
        tokens_path = Path(f"{prefix}{TOKENS_SUFFIX}")
        offsets_path = Path(f"{prefix}{OFFSETS_SUFFIX}")
        return cls(
            tokens=np.load(tokens_path, mmap_mode="r"),
            offsets=np.load(offsets_path, mmap_mode="r"),
            tokens_path=tokens_path,
            offsets_path=offsets_path,
        )

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def _read_offsets(self, first: int, count: int) -> np.ndarray:
        if self._offsets_fd is None:
            return np.asarray(self._offsets[first : first + count])
        return _pread_elements(self._offsets_fd, self._offsets, first, count)

    def __getitem__(self, index: int) -> np.ndarray:
        """Returns sentence `index`'s ids (read-only; negative indices count back)."""
        count = len(self)
        index = int(index)
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError(f"index {index} out of range for {count} sentences")
        start, end = (int(offset) for offset in self._read_offsets(index, 2))
        if self._tokens_fd is None:
            return self._tokens[start:end]
        return _pread_elements(self._tokens_fd, self._tokens, start, end - start)

    @property
    def lengths(self) -> np.ndarray:
        """Number of pieces of every sentence (int32, computed once, 4 bytes a sentence)."""
        if self._lengths is None:
            count = len(self)
            lengths = np.empty(count, dtype=np.int32)
            chunk = 1 << 20
            for first in range(0, count, chunk):
                size = min(chunk, count - first)
                offsets = self._read_offsets(first, size + 1)
                np.subtract(offsets[1:], offsets[:-1], out=lengths[first : first + size],
                            casting="unsafe")
            self._lengths = lengths
        return self._lengths

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if self._tokens_path is not None and self._offsets_path is not None:
            # Pickling a memmap copies its whole content; reopen the files instead.
            state["_tokens"] = None
            state["_offsets"] = None
        state["_lengths"] = None
        state["_tokens_fd"] = state["_offsets_fd"] = None  # meaningless in another process
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._tokens is None:
            self._tokens = np.load(self._tokens_path, mmap_mode="r")
            self._offsets = np.load(self._offsets_path, mmap_mode="r")
        self._open_files()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sentences={len(self)}, tokens={len(self._tokens)})"


class IndexedSamples(list):
    """A list of dataset items that also carries their dataset indices."""

    def __init__(self, items: list[Any], *, indices: list[int]) -> None:
        super().__init__(items)
        self.indices = list(indices)


class ParallelDataset:
    """Aligned source and target sentences; a map-style dataset for torch's DataLoader.

    Items are numpy arrays of piece ids without bos/eos; `seq2seq.data.batching.collate` pads
    them and adds the special ids.
    """

    # The same pairs every epoch (a training set that changes, SampledPairs, says False).
    same_each_epoch = True

    def set_epoch(self, epoch: int) -> None:
        """Nothing to do: the stored pairs are every epoch's."""

    def __init__(self, *, src: TokenArray, tgt: TokenArray) -> None:
        """Pairs two token arrays, target sentence i translating source sentence i.

        Raises:
            ValueError: If the sides have different numbers of sentences.
        """
        if len(src) != len(tgt):
            raise ValueError(f"source has {len(src)} sentences but target has {len(tgt)}")
        self.src = src
        self.tgt = tgt

    @classmethod
    def load(cls, prefix: Path) -> ParallelDataset:
        """Memory-maps `<prefix>.src.*.npy` and `<prefix>.tgt.*.npy`."""
        return cls(
            src=TokenArray.load(Path(f"{prefix}.src")), tgt=TokenArray.load(Path(f"{prefix}.tgt"))
        )

    def __len__(self) -> int:
        return len(self.src)

    def first(self, count: int) -> ParallelDataset:
        """The first ``count`` pairs (all of them if there are fewer), copied into memory."""
        def head(side: TokenArray) -> TokenArray:
            offsets = np.array(side._read_offsets(0, min(count, len(side)) + 1), dtype=np.int64)
            return TokenArray(tokens=np.array(side._tokens[: int(offsets[-1])]), offsets=offsets)
        return ParallelDataset(src=head(self.src), tgt=head(self.tgt))

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        return self.src[index], self.tgt[index]

    def __getitems__(self, indices: list[int]) -> IndexedSamples:
        """Fetches a batch of items; torch's DataLoader calls this with a batch sampler.

        The result remembers the indices, so `collate` can fill Batch.indices.
        """
        return IndexedSamples([self[index] for index in indices], indices=indices)

    @property
    def src_lengths(self) -> np.ndarray:
        """Source pieces per sentence (without eos)."""
        return self.src.lengths

    @property
    def tgt_lengths(self) -> np.ndarray:
        """Target pieces per sentence (without bos/eos)."""
        return self.tgt.lengths

    def __repr__(self) -> str:
        return f"{type(self).__name__}(pairs={len(self)})"


class _NpyAppender:
    """Writes a 1-D `.npy` file whose length is only known at the end.

    The header is written first with a zero length and rewritten on close: numpy pads 1-D
    headers so that the length can grow in place, which keeps writing a single streaming pass.
    """

    def __init__(self, *, path: Path, dtype: Any) -> None:
        self._path = Path(path)
        self._dtype = np.dtype(dtype)
        self._count = 0
        self._file = open(self._path, "wb")  # noqa: SIM115 - closed in close()/abort()
        self._header_length = self._write_header(0)

    def _write_header(self, count: int) -> int:
        start = self._file.tell()
        header = {
            "descr": np.lib.format.dtype_to_descr(self._dtype),
            "fortran_order": False,
            "shape": (count,),
        }
        np.lib.format.write_array_header_1_0(self._file, header)
        return self._file.tell() - start

    def append(self, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=self._dtype)
        self._file.write(values.tobytes())
        self._count += len(values)

    def close(self) -> None:
        self._file.seek(0)
        header_length = self._write_header(self._count)
        self._file.close()
        if header_length != self._header_length:  # numpy >= 1.23 pads it: never the case
            raise RuntimeError(f"{self._path}: numpy wrote a header of another length")

    def abort(self) -> None:
        self._file.close()


class TokenArrayWriter:
    """Streams sentences into the `<prefix>.tokens.npy` / `<prefix>.offsets.npy` pair.

    Sentences are appended chunk by chunk, so a corpus never needs to fit in memory.
    """

    def __init__(self, *, prefix: Path, dtype: Any) -> None:
        """Creates (truncates) both files; `prefix` is a path without the suffixes, `dtype` the
        token dtype (e.g. np.uint16 for vocabularies below 65535 pieces)."""
        self._tokens = _NpyAppender(path=Path(f"{prefix}{TOKENS_SUFFIX}"), dtype=dtype)
        self._offsets = _NpyAppender(path=Path(f"{prefix}{OFFSETS_SUFFIX}"), dtype=np.int64)
        self._offsets.append(np.zeros(1, dtype=np.int64))
        self._total = 0
        self.sentences = 0

    def append(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Appends a chunk of sentences: their ids concatenated, and their lengths (which must
        sum to len(tokens))."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if int(lengths.sum()) != len(tokens):
            raise ValueError(
                f"lengths sum to {int(lengths.sum())} but there are {len(tokens)} tokens"
            )
        self._tokens.append(tokens)
        self._offsets.append(self._total + np.cumsum(lengths))
        self._total += len(tokens)
        self.sentences += len(lengths)

    def close(self) -> None:
        """Finishes both files (then readable with `TokenArray.load`)."""
        self._tokens.close()
        self._offsets.close()

    def abort(self) -> None:
        """Closes the files without finishing them (their directory is about to be deleted)."""
        self._tokens.abort()
        self._offsets.abort()
