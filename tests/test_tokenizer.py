"""SentencePieceTokenizer: training, fixed special ids, round trips, serialization."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from seq2seq.data.text_files import DataError
from seq2seq.data.tokenizer import SentencePieceTokenizer, SubsetTokenizer
from seq2seq.data.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID

Pairs = Callable[..., list[tuple[str, str]]]


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    import random

    from conftest import make_pairs

    pairs = make_pairs(random.Random(7), 300)
    return [sentence for pair in pairs for sentence in pair]


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def tokenizer(request: pytest.FixtureRequest, sentences: list[str]) -> SentencePieceTokenizer:
    return SentencePieceTokenizer.train(
        sentences, model_type=request.param, vocab_size=60, character_coverage=1.0, seed=1
    )


def test_special_ids_are_fixed(tokenizer: SentencePieceTokenizer) -> None:
    assert tokenizer.id_to_piece(PAD_ID) == "<pad>"
    assert tokenizer.id_to_piece(UNK_ID) == "<unk>"
    assert tokenizer.id_to_piece(BOS_ID) == "<s>"
    assert tokenizer.id_to_piece(EOS_ID) == "</s>"
    assert tokenizer.vocab_size == 60


def test_round_trip_text_ids_text(tokenizer: SentencePieceTokenizer, sentences: list[str]) -> None:
    batch = sentences[:40] + [""]
    ids = tokenizer.encode(batch)
    assert len(ids) == len(batch)
    assert ids[-1] == []
    assert all(BOS_ID not in row and EOS_ID not in row and PAD_ID not in row for row in ids)
    assert tokenizer.decode(ids) == batch
    pieces = tokenizer.pieces(ids[0])
    assert "".join(pieces).replace("\u2581", " ").strip() == batch[0]
    # Another engine's output comes back as pieces (CTranslate2's translations).
    assert tokenizer.decode_pieces([tokenizer.pieces(row) for row in ids]) == batch


def test_decode_skips_pad_and_bos_and_stops_at_eos(
    tokenizer: SentencePieceTokenizer, sentences: list[str]
) -> None:
    ids = tokenizer.encode(sentences[:2])
    decoder_output = [
        [BOS_ID, *ids[0], EOS_ID, *ids[1]],
        np.array([BOS_ID, *ids[1], EOS_ID, PAD_ID, PAD_ID]),
        torch.tensor([PAD_ID, *ids[0]]),
    ]
    assert tokenizer.decode(decoder_output) == [sentences[0], sentences[1], sentences[0]]


def test_a_subset_decodes_as_its_base_and_refuses_ids_outside_it(
    tokenizer: SentencePieceTokenizer, sentences: list[str]
) -> None:
    ids = tokenizer.encode(sentences[:2])
    subset = SubsetTokenizer(base=tokenizer, kept_ids=sorted({i for line in ids for i in line}))
    assert subset.decode(subset.encode(sentences[:2])) == tokenizer.decode(ids)
    for outside in (-1, subset.vocab_size):  # -1 would otherwise be the last kept piece
        with pytest.raises(IndexError, match=f"id {outside} outside the vocabulary"):
            subset.decode([[5, outside]])


def test_unknown_characters_map_to_unk(tokenizer: SentencePieceTokenizer) -> None:
    assert UNK_ID in tokenizer.encode(["ka \u4e2d lo"])[0]


def test_bytes_and_file_round_trip(tokenizer: SentencePieceTokenizer, tmp_path: Path) -> None:
    sample = ["kalo mi nupe", "zu bar den"]
    copy = SentencePieceTokenizer.from_bytes(tokenizer.to_bytes())
    assert copy.encode(sample) == tokenizer.encode(sample)
    tokenizer.save(tmp_path / "model.model")
    assert SentencePieceTokenizer.load(tmp_path / "model.model").encode(sample) == tokenizer.encode(
        sample
    )


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_too_large_vocabulary_is_lowered_with_a_warning(
    model_type: str, sentences: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="seq2seq.data.tokenizer"):
        tokenizer = SentencePieceTokenizer.train(
            sentences, model_type=model_type, vocab_size=50_000
        )
    assert 4 < tokenizer.vocab_size < 50_000
    assert any(
        "vocabulary size lowered from 50000" in record.getMessage() for record in caplog.records
    )
    assert tokenizer.decode(tokenizer.encode(sentences[:5])) == sentences[:5]


def test_same_seed_same_model(sentences: list[str]) -> None:
    first = SentencePieceTokenizer.train(sentences, vocab_size=100, seed=3, max_sentences=200)
    second = SentencePieceTokenizer.train(sentences, vocab_size=100, seed=3, max_sentences=200)
    assert first.to_bytes() == second.to_bytes()


def test_errors_from_the_sentence_stream_keep_their_type() -> None:
    def stream() -> Iterator[str]:
        yield "kalo mi"
        raise DataError("corpus.txt: line 2 is not valid UTF-8")

    with pytest.raises(DataError, match="line 2"):
        SentencePieceTokenizer.train(stream(), vocab_size=20)


def test_untrainable_input_is_a_data_error() -> None:
    with pytest.raises(DataError, match="no training sentences"):
        SentencePieceTokenizer.train([], vocab_size=20)
    with pytest.raises(ValueError, match="model_type"):
        SentencePieceTokenizer.train(["a b"], model_type="wordpiece", vocab_size=20)
