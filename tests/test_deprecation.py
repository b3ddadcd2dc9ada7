"""Renamed modules: the old import path works for one release, warning once."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

# Old path -> (new path, a name imported through the old path, its name in the new module).
MOVED = {
    "seq2seq.inference.search": ("seq2seq.inference.search_loop", "Choose", "Greedy"),
    "seq2seq.data.corpus": ("seq2seq.data.text_files", "DataError", "DataError"),
    "seq2seq.models.scorers": ("seq2seq.models.attention_scorers", "AdditiveScorer",
                               "AdditiveScorer"),
    "seq2seq.inference.loading": ("seq2seq.inference.model_files", "load_model_payload",
                                  "load_model_payload"),
}


@pytest.mark.parametrize("old", MOVED)
def test_an_old_import_path_warns_once_and_works(old, monkeypatch):
    new, name, new_name = MOVED[old]
    monkeypatch.delitem(sys.modules, old, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = importlib.import_module(old)
        again = importlib.import_module(old)
    assert again is first
    assert [str(w.message) for w in caught if w.category is DeprecationWarning] == [
        f"{old} is now {new}" + ("; Choose is Greedy; Beams is SearchState" if name == "Choose"
                                 else "") + ": the old path goes in the next release"]
    assert getattr(first, name) is getattr(importlib.import_module(new), new_name)
