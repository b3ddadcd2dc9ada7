"""Decodings of a checkpoint made before the cleanup of #88 (commit 3d8c1c7), as that commit's
translator gave them: greedy, beam 5 with its 5-best and scores, constraints, prefixes and
seeded sampling, read from tests/data/ (tests/data/make_golden_decodings.py made both files).

The model is the tests' trained copy model and the sentences are copy-task ones, so every choice
it makes is a clear one: another CPU's rounding changes the scores in their last digits, never
a translation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seq2seq.inference.decode_options import DecodeOptions
from seq2seq.inference.runtimes import load_translator

DATA = Path(__file__).resolve().parent / "data"
GOLDEN = json.loads((DATA / "golden_decodings.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def translator():
    return load_translator(DATA / "golden_copy_gru.pt", "cpu", precision="fp32")


@pytest.mark.parametrize("name", list(GOLDEN["cases"]))
def test_the_checkpoint_decodes_as_before(translator, name):
    case = GOLDEN["cases"][name]
    results = translator.translate(GOLDEN["sentences"], DecodeOptions(**case["options"]),
                                   return_attention=False, prefixes=case["prefixes"],
                                   constraints=case["constraints"])
    got = [[t.text for t in n_best] for n_best in results]
    assert got == [[t["text"] for t in n_best] for n_best in case["translations"]]
    for n_best, old in zip(results, case["translations"], strict=True):
        assert [t.score for t in n_best] == pytest.approx([t["score"] for t in old], abs=1e-4)
