"""Reading parallel corpora: formats, and the errors bad input must produce."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from seq2seq.data.text_files import (
    DataError,
    check_parallel,
    iter_lines,
    iter_parallel_chunks,
    read_lines,
)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_plain_and_gzip_read_the_same(tmp_path: Path) -> None:
    lines = ["ein Haus", "", "zwei  Häuser ", "drei"]
    text = "".join(f"{line}\n" for line in lines).encode("utf-8")
    plain = _write(tmp_path / "a.txt", text)
    compressed = _write(tmp_path / "a.txt.gz", gzip.compress(text))
    # Compression is detected from the content, not the name.
    misnamed = _write(tmp_path / "b.txt", gzip.compress(text))
    assert read_lines(plain) == lines
    assert read_lines(compressed) == lines
    assert read_lines(misnamed) == lines


def test_line_terminators_bom_and_missing_final_newline(tmp_path: Path) -> None:
    path = _write(tmp_path / "crlf.txt", "\ufeffone\r\ntwo\u2028still two\r\nthree".encode())
    assert list(iter_lines(path)) == ["one", "two\u2028still two", "three"]


def test_parallel_chunks_cover_every_pair_in_order(tmp_path: Path) -> None:
    src = _write(tmp_path / "s.txt", "".join(f"s{i}\n" for i in range(25)).encode())
    tgt = _write(tmp_path / "t.txt", "".join(f"t{i}\n" for i in range(25)).encode())
    chunks = list(iter_parallel_chunks(src, tgt, chunk_lines=10))
    assert [len(source) for source, _ in chunks] == [10, 10, 5]
    assert [line for source, _ in chunks for line in source] == [f"s{i}" for i in range(25)]
    assert [line for _, target in chunks for line in target] == [f"t{i}" for i in range(25)]
    assert check_parallel(src, tgt) == 25


@pytest.mark.parametrize(("src_count", "tgt_count"), [(7, 5), (5, 7)])
def test_line_count_mismatch_names_both_files_and_counts(
    tmp_path: Path, src_count: int, tgt_count: int
) -> None:
    src = _write(tmp_path / "train.de", b"x\n" * src_count)
    tgt = _write(tmp_path / "train.en", b"y\n" * tgt_count)
    with pytest.raises(DataError) as caught:
        check_parallel(src, tgt)
    message = str(caught.value)
    assert "\n" not in message
    assert f"{src} has {src_count} lines" in message
    assert f"{tgt} has {tgt_count} lines" in message


def test_invalid_utf8_names_file_and_line(tmp_path: Path) -> None:
    src = _write(tmp_path / "s.txt", b"fine\nalso fine\nbroken \xff byte\n")
    tgt = _write(tmp_path / "t.txt", b"a\nb\nc\n")
    with pytest.raises(DataError) as caught:
        check_parallel(src, tgt)
    assert str(src) in str(caught.value)
    assert "line 3" in str(caught.value)
    assert "UTF-8" in str(caught.value)


def test_invalid_utf8_inside_gzip_is_reported_by_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "s.gz", gzip.compress(b"ok\n\xc3\x28\n"))
    with pytest.raises(DataError, match=r"line 2 is not valid UTF-8"):
        read_lines(path)


def test_missing_file_names_its_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "train.de"
    present = _write(tmp_path / "t.txt", b"a\n")
    with pytest.raises(DataError, match="file not found") as caught:
        check_parallel(missing, present)
    assert str(missing) in str(caught.value)


def test_truncated_gzip_is_a_data_error(tmp_path: Path) -> None:
    data = gzip.compress(b"some line\n" * 1000)
    path = _write(tmp_path / "cut.gz", data[: len(data) // 2])
    with pytest.raises(DataError, match=str(path)):
        read_lines(path)
