"""Scores by source length (seq2seq.study.buckets): the buckets partition the corpus, a group's
score in a bucket is that of its sentences there, the report's section and the interval."""

from __future__ import annotations

import pytest

from seq2seq.metrics import corpus_scores
from seq2seq.study.buckets import (
    LENGTH_BUCKETS,
    bucket_label,
    bucket_scores,
    length_bucket,
    markdown_section,
)


def sentence(words: int, start: int = 0) -> str:
    return " ".join(f"w{start + i}" for i in range(words))


SOURCES = [sentence(n) for n in (3, 5, 9, 10, 12, 14, 15, 19, 20, 31)] * 3 + [""]
REFERENCES = [sentence(n, 100) for n in (4, 6, 8, 9, 11, 13, 16, 18, 21, 30)] * 3 + [""]


def test_every_non_empty_sentence_is_in_exactly_one_bucket():
    assert [bucket_label(b) for b in LENGTH_BUCKETS] == ["1-9", "10-14", "15-19", "20+"]
    assert [length_bucket(s) for s in SOURCES[:10]] == [
        "1-9", "1-9", "1-9", "10-14", "10-14", "10-14", "15-19", "15-19", "20+", "20+"]
    assert length_bucket("") is None
    (row,) = bucket_scores([("g", [REFERENCES])], SOURCES, REFERENCES, resamples=50)
    assert sum(b["sentences"] for b in row["buckets"].values()) == len(SOURCES) - 1


def test_a_bucket_scores_its_own_sentences_pooled_over_seeds():
    """Perfect on short sources, wrong on long ones: 100 and 0 by bucket; two seeds pool."""
    short = {i for i, s in enumerate(SOURCES) if length_bucket(s) == "1-9"}
    good_short = [ref if i in short else "x y z" for i, ref in enumerate(REFERENCES)]
    other_seed = [ref if i in short else REFERENCES[i] for i, ref in enumerate(REFERENCES)]
    (row,) = bucket_scores([("g", [good_short, other_seed])], SOURCES, REFERENCES,
                           resamples=200)
    assert row["buckets"]["1-9"]["bleu"] == pytest.approx(100.0)
    assert row["buckets"]["1-9"]["bleu_ci"] == pytest.approx(0.0)
    indices = [i for i, s in enumerate(SOURCES) if length_bucket(s) == "15-19"]
    pooled = [good_short[i] for i in indices] + [other_seed[i] for i in indices]
    expected = corpus_scores(pooled, [REFERENCES[i] for i in indices] * 2)
    assert row["buckets"]["15-19"]["bleu"] == pytest.approx(expected["bleu"])
    assert row["buckets"]["15-19"]["chrf"] == pytest.approx(expected["chrf"])
    assert row["buckets"]["15-19"]["bleu_ci"] > 0  # half its outputs are wrong


def test_the_report_section_names_the_buckets_and_their_sentences():
    rows = bucket_scores([("a", [REFERENCES]), ("b", [["x"] * len(REFERENCES)])],
                         SOURCES[:6] + [""] * 25, REFERENCES, resamples=50)
    lines = markdown_section(rows)
    assert lines[0] == "## By source length"
    header = next(line for line in lines if line.startswith("| group"))
    assert "1-9 words (3 sentences)" in header and "10-14 words (3 sentences)" in header
    assert "15-19" not in header  # no sentence there
    row_a = next(line for line in lines if line.startswith("| a |"))
    assert row_a.count("100.00 ± 0.00") == 4  # BLEU and chrF in both buckets
    assert markdown_section([]) == []
