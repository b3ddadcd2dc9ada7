"""Checkpoints are read weights-only: crafted pickles are refused, broken files explained."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_translator import make_checkpoint

from seq2seq.checkpoint import CheckpointError, load_checkpoint
from seq2seq.inference.translator import Translator

ROOT = Path(__file__).resolve().parents[1]


class TouchOnLoad:
    """Unpickling this calls ``Path.touch(marker)``: any code could run in its place."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def malicious_checkpoint(path: Path, marker: Path) -> Path:
    torch.save({"format_version": 1, "model": {}, "payload": TouchOnLoad(marker)}, path)
    return path


def truncated_checkpoint(path: Path, directory: Path) -> Path:
    data = make_checkpoint(directory).read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def random_bytes_file(path: Path) -> Path:
    path.write_bytes(
        torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0))
        .to(torch.uint8)
        .numpy()
        .tobytes()
    )
    return path


def test_pickled_code_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = malicious_checkpoint(tmp_path / "evil.pt", marker)
    with pytest.raises(CheckpointError, match="refusing to load .* could run code"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="refusing to load"):
        Translator.from_checkpoint(path)
    assert not marker.exists()
    # The file really is dangerous: an unsafe load runs the payload.
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_truncated_file_gets_a_clear_message(tmp_path):
    path = truncated_checkpoint(tmp_path / "truncated.pt", tmp_path / "model")
    with pytest.raises(CheckpointError, match="truncated or corrupted") as caught:
        load_checkpoint(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_random_bytes_are_refused_with_a_one_line_message(tmp_path):
    path = random_bytes_file(tmp_path / "random.pt")
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_random_bytes_are_reported_as_corrupted(tmp_path):
    path = random_bytes_file(tmp_path / "random.pt")
    with pytest.raises(CheckpointError, match="truncated or corrupted"):
        load_checkpoint(path)


@pytest.mark.parametrize("kind", ["pickle", "truncated", "random"])
def test_command_line_refuses_bad_checkpoints_without_traceback(tmp_path, kind):
    marker = tmp_path / "pwned"
    if kind == "pickle":
        path = malicious_checkpoint(tmp_path / "bad.pt", marker)
        expected = "refusing to load"
    elif kind == "truncated":
        path = truncated_checkpoint(tmp_path / "bad.pt", tmp_path / "model")
        expected = "truncated or corrupted"
    else:
        path = random_bytes_file(tmp_path / "bad.pt")
        expected = str(path)
    tool = "translate.py" if kind != "truncated" else "evaluate.py"
    result = subprocess.run(
        [sys.executable, str(ROOT / tool), f"checkpoint={path}"],
        cwd=tmp_path,
        input="red cat\n",
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=120,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0]
    assert not marker.exists()
