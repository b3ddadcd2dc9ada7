"""Fetching Multi30k: local-directory and file:// mirrors, checksums, no second download."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from seq2seq.data import multi30k
from seq2seq.data.sources import corpus_files_from_config
from seq2seq.data.text_files import DataError, read_lines

SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
SHARED_MIRROR = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


@pytest.fixture
def fake_mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tiny de/en mirror whose checksums replace the real table for the test."""
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    sums = {}
    for split, size in (("train", 6), ("val", 3), ("test_2016_flickr", 2)):
        for language in ("de", "en"):
            name = f"{split}.{language}.gz"
            lines = "".join(f"{split} {language} sentence {i}\n" for i in range(size))
            data = gzip.compress(lines.encode(), mtime=0)
            (mirror / name).write_bytes(data)
            sums[name] = hashlib.sha256(data).hexdigest()
    monkeypatch.setattr(multi30k, "SHA256_SUMS", sums)
    return mirror


def _fetch(base_url: str, directory: Path) -> dict[str, tuple[Path, Path]]:
    return multi30k.fetch_multi30k(
        base_url=base_url, directory=directory, src_lang="de", tgt_lang="en", splits=SPLITS
    )


def test_fetch_from_local_directory(fake_mirror: Path, tmp_path: Path) -> None:
    files = _fetch(str(fake_mirror), tmp_path / "data")
    assert set(files) == {"train", "valid", "test"}
    src, tgt = files["valid"]
    assert src == tmp_path / "data" / "val.de.gz"
    assert read_lines(src) == [f"val de sentence {i}" for i in range(3)]
    assert read_lines(tgt)[0] == "val en sentence 0"
    # Nothing half-written is left behind.
    assert not [path for path in (tmp_path / "data").iterdir() if path.name.startswith(".")]


def test_fetch_from_file_url(fake_mirror: Path, tmp_path: Path) -> None:
    files = _fetch(fake_mirror.as_uri(), tmp_path / "data")
    assert read_lines(files["train"][0])[5] == "train de sentence 5"


@pytest.fixture
def http_mirror(fake_mirror: Path) -> Iterator[str]:
    """Serves the fake mirror over http on localhost (no outside network involved)."""

    class QuietHandler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    handler = functools.partial(QuietHandler, directory=str(fake_mirror))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_fetch_over_http(http_mirror: str, fake_mirror: Path, tmp_path: Path) -> None:
    files = _fetch(http_mirror, tmp_path / "data")
    assert files["test"][1].read_bytes() == (fake_mirror / "test_2016_flickr.en.gz").read_bytes()
    (fake_mirror / "val.de.gz").unlink()
    with pytest.raises(DataError, match="HTTP 404"):
        _fetch(http_mirror, tmp_path / "other")


def test_no_second_download(
    fake_mirror: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = _fetch(str(fake_mirror), tmp_path / "data")
    mtimes = {path: path.stat().st_mtime_ns for pair in files.values() for path in pair}

    def refuse(base_url: str, name: str) -> None:
        raise AssertionError(f"downloaded {name} a second time")

    monkeypatch.setattr(multi30k, "_open_source", refuse)
    again = _fetch(str(fake_mirror), tmp_path / "data")
    assert again == files
    assert {path: path.stat().st_mtime_ns for pair in again.values() for path in pair} == mtimes


def test_wrong_checksum_of_download_is_rejected(
    fake_mirror: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = "0" * 64
    monkeypatch.setitem(multi30k.SHA256_SUMS, "val.en.gz", expected)
    actual = hashlib.sha256((fake_mirror / "val.en.gz").read_bytes()).hexdigest()
    with pytest.raises(DataError) as caught:
        _fetch(str(fake_mirror), tmp_path / "data")
    message = str(caught.value)
    assert "val.en.gz" in message and expected in message and actual in message
    assert not (tmp_path / "data" / "val.en.gz").exists()
    assert not [path for path in (tmp_path / "data").iterdir() if path.name.startswith(".")]


def test_existing_file_with_wrong_checksum_is_an_error(fake_mirror: Path, tmp_path: Path) -> None:
    directory = tmp_path / "data"
    directory.mkdir()
    corrupted = directory / "train.de.gz"
    corrupted.write_bytes(b"not the real file")
    with pytest.raises(DataError, match="checksum mismatch") as caught:
        _fetch(str(fake_mirror), directory)
    assert str(corrupted) in str(caught.value)
    assert hashlib.sha256(b"not the real file").hexdigest() in str(caught.value)
    # An existing file is never silently replaced.
    assert corrupted.read_bytes() == b"not the real file"


@pytest.mark.parametrize(
    ("src_lang", "tgt_lang", "splits", "pattern"),
    [
        ("xx", "en", SPLITS, "unknown Multi30k language 'xx'"),
        ("de", "de", SPLITS, "both 'de'"),
        ("de", "en", {"train": "train", "valid": "dev"}, "unknown Multi30k split 'dev'"),
        ("cs", "en", {"train": "test_2017_flickr"}, "has no 'cs' side"),
    ],
)
def test_bad_languages_and_splits(
    tmp_path: Path, src_lang: str, tgt_lang: str, splits: dict[str, str], pattern: str
) -> None:
    with pytest.raises(DataError, match=pattern):
        multi30k.fetch_multi30k(
            base_url=str(tmp_path),
            directory=tmp_path / "data",
            src_lang=src_lang,
            tgt_lang=tgt_lang,
            splits=splits,
        )
    assert not (tmp_path / "data").exists()


def test_missing_mirror_file_is_a_data_error(fake_mirror: Path, tmp_path: Path) -> None:
    (fake_mirror / "test_2016_flickr.en.gz").unlink()
    with pytest.raises(DataError, match="test_2016_flickr.en.gz"):
        _fetch(fake_mirror.as_uri(), tmp_path / "data")


def test_config_resolution_fetches_and_can_skip_a_split(fake_mirror: Path, tmp_path: Path) -> None:
    config = {
        "kind": "multi30k",
        "src_lang": "en",
        "tgt_lang": "de",
        "base_url": str(fake_mirror),
        "dir": str(tmp_path / "data"),
        "splits": {"train": "train", "valid": "val", "test": None},
    }
    files = corpus_files_from_config(config)
    assert set(files) == {"train", "valid"}
    assert files["train"] == (tmp_path / "data" / "train.en.gz", tmp_path / "data" / "train.de.gz")


@pytest.mark.skipif(not SHARED_MIRROR.is_dir(), reason=f"no Multi30k mirror at {SHARED_MIRROR}")
def test_embedded_checksums_match_the_mirror_list() -> None:
    listed = {}
    for line in (SHARED_MIRROR / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        listed[name] = digest
    assert listed == multi30k.SHA256_SUMS
    assert os.path.exists(SHARED_MIRROR / "train.de.gz")
