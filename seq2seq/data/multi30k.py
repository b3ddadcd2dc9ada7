"""Fetching the Multi30k task-1 raw corpus, checked against its known SHA-256 sums.

Files are named `<split>.<lang>.gz` both in the mirror and in the local directory. A file
already present with the right checksum is reused (never downloaded twice); a present file
with a wrong checksum is an error rather than silently replaced, since it may be someone's
edited copy.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

from seq2seq.atomic import atomic_write
from seq2seq.data.hashing import sha256_file
from seq2seq.data.text_files import DataError

logger = logging.getLogger(__name__)

LANGUAGES = ("en", "de", "fr", "cs")
SPLITS = (
    "train",
    "val",
    "test_2016_flickr",
    "test_2017_flickr",
    "test_2017_mscoco",
    "test_2018_flickr",
)
DEFAULT_BASE_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"

# SHA-256 of every file of the mirror (multi30k/dataset, data/task1/raw, commit a3d2e0d).
# A (split, language) missing here does not exist upstream (e.g. Czech for test_2017_*).
SHA256_SUMS: dict[str, str] = {
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "test_2017_flickr.de.gz": "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
    "test_2017_flickr.en.gz": "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
    "test_2017_flickr.fr.gz": "3ba671ceb2299f3304ffafefea7a833d08632fbaf0ba18546f8a2ec2391af496",
    "test_2017_mscoco.de.gz": "799e4854c25d601cb6cb6be29eabe5667734c61ace2f495e03e429031a0bc338",
    "test_2017_mscoco.en.gz": "aab300bfb4427697987e02cd0aacd44bfe8aa50456231b6474c08038bbed2b58",
    "test_2017_mscoco.fr.gz": "754f3072ba9f124569ba5258b32730fc1d214bbf8e0c6dfb2b74401676220db0",
    "test_2018_flickr.cs.gz": "7d0a9db904f94c554a8c58049a9f3a5357c27f46cc3d710d70cb0b4a2585b8c2",
    "test_2018_flickr.de.gz": "ddd0130c7d97482dc5197a02141dae8dd79f20f03586c480d675c09a32daf608",
    "test_2018_flickr.en.gz": "ef4f4844037d4c5dea75c9a8ed5fd78905967a26f67c255e230cc9780032654d",
    "test_2018_flickr.fr.gz": "fb2b83fcceb937a4f7e3e93c1c51c22aba92f1e342391e6b5ba392b16a920501",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
}

_URL_SCHEMES = ("http", "https", "file")
_DOWNLOAD_TIMEOUT_SECONDS = 60


def file_name(split: str, language: str) -> str:
    """Returns the mirror's file name for one split and language (e.g. "train.de.gz"),
    checking both exist.

    Raises:
        DataError: If the split or language is unknown, or that split lacks that language.
    """
    _check_language(language)
    if split not in SPLITS:
        raise DataError(f"unknown Multi30k split {split!r}: expected one of {', '.join(SPLITS)}")
    name = f"{split}.{language}.gz"
    if name not in SHA256_SUMS:
        raise DataError(f"Multi30k split {split!r} has no {language!r} side")
    return name


def _check_language(language: str) -> None:
    if language not in LANGUAGES:
        raise DataError(
            f"unknown Multi30k language {language!r}: expected one of {', '.join(LANGUAGES)}"
        )


def _is_url(base_url: str) -> bool:
    return urllib.parse.urlsplit(base_url).scheme.lower() in _URL_SCHEMES


def _open_source(base_url: str, name: str) -> tuple[BinaryIO, str]:
    """Opens one mirror file for reading; returns the stream and a printable location."""
    if _is_url(base_url):
        url = f"{base_url.rstrip('/')}/{urllib.parse.quote(name)}"
        try:
            return urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_SECONDS), url
        except urllib.error.HTTPError as error:
            raise DataError(f"cannot download {url}: HTTP {error.code} {error.reason}") from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", None) or error
            raise DataError(f"cannot download {url}: {reason}") from None
    path = Path(base_url).expanduser() / name
    try:
        return open(path, "rb"), str(path)
    except FileNotFoundError:
        raise DataError(f"file not found: {path} (Multi30k mirror {base_url})") from None
    except OSError as error:
        raise DataError(f"cannot open {path}: {error.strerror or error}") from None


def _checksum_error(path: Path | str, expected: str, actual: str) -> DataError:
    return DataError(f"checksum mismatch for {path}: expected sha256 {expected}, got {actual}")


def _download(*, base_url: str, name: str, destination: Path, expected: str) -> None:
    """Copies one file from the mirror into `destination`, verified, all or nothing."""
    source, location = _open_source(base_url, name)
    try:
        with source, atomic_write(destination, suffix=".part") as target:
            digest = hashlib.sha256()
            while block := source.read(1 << 20):
                digest.update(block)
                target.write(block)
            actual = digest.hexdigest()
            if actual != expected:
                # Raised inside the block, so the temporary file is discarded unrenamed.
                raise _checksum_error(location, expected, actual)
    except (OSError, http.client.HTTPException) as error:
        raise DataError(f"cannot download {location}: {error}") from None


def fetch_file(*, base_url: str, directory: Path, split: str, language: str) -> Path:
    """Makes one Multi30k file available in `directory` (created when missing), downloading it
    only when missing; returns the path of the verified local file.

    Args:
        base_url: Mirror location: an http(s):// or file:// URL, or a local directory path.

    Raises:
        DataError: On an unknown split/language, a failed download, or a wrong checksum
            (naming the file, the expected and the actual sum).
    """
    name = file_name(split, language)
    expected = SHA256_SUMS[name]
    directory = Path(directory).expanduser()
    destination = directory / name
    if destination.exists():
        actual = sha256_file(destination)
        if actual != expected:
            raise _checksum_error(destination, expected, actual)
        return destination
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DataError(f"cannot create {directory}: {error.strerror or error}") from None
    logger.info("fetching %s from %s", name, base_url)
    _download(base_url=base_url, name=name, destination=destination, expected=expected)
    return destination


def fetch_multi30k(
    *,
    base_url: str,
    directory: Path,
    src_lang: str,
    tgt_lang: str,
    splits: Mapping[str, str | None],
) -> dict[str, tuple[Path, Path]]:
    """Makes the requested Multi30k splits available locally for one language pair; returns
    our split name -> (source file, target file), verified. `base_url` and `directory` are as
    for `fetch_file`.

    Args:
        splits: Our split name -> Multi30k split name, e.g. {"train": "train",
            "valid": "val", "test": "test_2016_flickr"}; a None value leaves that split out.

    Raises:
        DataError: On an unknown or repeated language, an unknown split, a failed download or a
            wrong checksum.
    """
    _check_language(src_lang)
    _check_language(tgt_lang)
    if src_lang == tgt_lang:
        raise DataError(f"source and target language are both {src_lang!r}")
    # Check every name before fetching anything, so a typo fails before a long download.
    wanted = {ours: theirs for ours, theirs in splits.items() if theirs is not None}
    for theirs in wanted.values():
        file_name(theirs, src_lang)
        file_name(theirs, tgt_lang)
    return {
        ours: (
            fetch_file(base_url=base_url, directory=directory, split=theirs, language=src_lang),
            fetch_file(base_url=base_url, directory=directory, split=theirs, language=tgt_lang),
        )
        for ours, theirs in wanted.items()
    }

