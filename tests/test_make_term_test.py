"""scripts/make_term_test.py: the terminology test's phrases, from a validation split."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "make_term_test.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60)


def test_the_rarest_uncommon_reference_words_in_reference_order(tmp_path):
    train = tmp_path / "train.en.gz"
    with gzip.open(train, "wt", encoding="utf-8") as handle:
        handle.write("A man walks a dog.\n" * 5 + "A man rides a bicycle near the river.\n"
                     + "Two kayaks.\n" * 2)
    ref = tmp_path / "val.en"
    ref.write_text("A man paddles kayaks on the river.\nA dog.\n\n", encoding="utf-8")
    out = tmp_path / "terms" / "val.constraints"
    result = run("--ref", str(ref), "--train-ref", str(train), "--output", str(out),
                 "--common", "3", "--per-sentence", "2")
    assert result.returncode == 0, result.stderr
    # "paddles" never occurs in training, "river" once, "kayaks" twice; "man" is common.
    assert out.read_text(encoding="utf-8").split("\n") == ["paddles\triver", "", "", ""]
    assert "2 phrases for 3 sentences" in result.stdout


def test_a_test_split_is_refused(tmp_path):
    ref = tmp_path / "test_2016_flickr.en"
    ref.write_text("A dog.\n", encoding="utf-8")
    result = run("--ref", str(ref), "--train-ref", str(ref), "--output", str(tmp_path / "x"))
    assert result.returncode == 2 and "validation split" in result.stderr
    assert not (tmp_path / "x").exists()
