"""The Translator on a tiny model trained (in conftest, once per session) to copy its input.

The model trains a little differently on every CPU kind, so only ``test_copy_model_translates``
asks what it translates to (sentences like its training data, with a wide margin); the other
tests compare two ways of getting a translation that must agree, or check the structure.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from conftest import greedy_search

from seq2seq.checkpoint import load_checkpoint, model_from_checkpoint
from seq2seq.data.batching import collate
from seq2seq.inference.decode_options import DecodeOptions
from seq2seq.inference.runtimes import load_translator
from seq2seq.inference.search_loop import Hypothesis
from seq2seq.inference.translator import Translation, Translator

BEAM4 = DecodeOptions(beam_size=4)


@pytest.fixture(scope="module")
def translator(trained_checkpoint) -> Translator:
    return load_translator(trained_checkpoint)


def assert_same_translations(got, want) -> None:
    """Two n-best lists of one sentence: the same texts, scores within float noise."""
    assert [t.text for t in got] == [t.text for t in want]
    assert [t.score for t in got] == pytest.approx([t.score for t in want], abs=1e-5)


def test_copy_model_translates(translator, copy_sentences):
    """The one test of what the model learned: sentences like its training data, which it
    copies all but ~1% of on any CPU kind (so 25 of 30 is a wide margin)."""
    inputs = copy_sentences(30, seed=123)
    outputs = [n_best[0].text for n_best in translator.translate(inputs, BEAM4)]
    assert sum(o == i for o, i in zip(outputs, inputs, strict=True)) >= 25


def test_order_count_empty_and_long_lines(translator, caplog):
    long_line = " ".join(["red cat"] * 200)  # 400 pieces
    inputs = ["blue dog", "", "one two three sun", long_line, "   ", "big house"]
    with caplog.at_level(logging.WARNING, logger="seq2seq.inference.translator"):
        results = translator.translate(inputs, BEAM4)
    assert len(results) == len(inputs)
    for index in (0, 2, 5):  # in input order: each is what that line gives alone
        alone = translator.translate([inputs[index]], BEAM4)[0]
        assert_same_translations(results[index], alone)
    for index in (1, 4):
        assert results[index] == [Translation("", 0.0, [], [], None)]
    assert len(results[3][0].source_pieces) == translator.max_source_length == 250
    assert results[3][0].attention.shape[1] == 251  # the cut source and its EOS
    assert "source sentence 4 has 400 pieces" in caplog.text


def test_results_do_not_depend_on_batching(trained_checkpoint, copy_sentences):
    path = trained_checkpoint
    inputs = copy_sentences(12, seed=7) + [""]
    options = DecodeOptions(beam_size=3)
    big = load_translator(path, max_tokens=4000).translate(inputs, options)
    small = load_translator(path, max_tokens=1).translate(inputs, options)
    for a, b in zip(big, small, strict=True):
        assert a[0].text == b[0].text
        assert a[0].score == pytest.approx(b[0].score, abs=1e-5)


def test_translation_fields_and_attention(translator):
    (best,) = translator.translate(["green bird sun"], BEAM4)[0]
    assert best.source_pieces == ["▁green", "▁bird", "▁sun"]
    assert best.text == "".join(best.target_pieces).replace("▁", " ").strip()
    rows = len(best.target_pieces) + 1
    assert best.attention.shape == (rows, 4)  # target pieces + EOS by 3 pieces + EOS
    torch.testing.assert_close(best.attention.sum(-1), torch.ones(rows))
    assert best.score < 0
    # The same search without attention: the same translation.
    (plain,) = translator.translate(["green bird sun"], BEAM4, return_attention=False)[0]
    assert (plain.text, plain.target_pieces, plain.attention) == (best.text, best.target_pieces,
                                                                  None)
    assert plain.score == pytest.approx(best.score, abs=1e-6)


def test_nbest_sorted_and_distinct(translator, copy_sentences):
    nbest3 = DecodeOptions(beam_size=4, nbest=3)
    inputs = copy_sentences(5, seed=9)
    for n_best in translator.translate(inputs, nbest3):
        assert len(n_best) == 3
        assert [t.score for t in n_best] == sorted((t.score for t in n_best), reverse=True)
        assert len({tuple(t.target_pieces) for t in n_best}) == 3
    # The first of the n-best is the 1-best.
    for n_best, (best,) in zip(translator.translate(inputs, nbest3),
                               translator.translate(inputs, BEAM4), strict=True):
        assert_same_translations(n_best[:1], [best])


def test_translate_ids_greedy_path_matches_greedy_search(trained_checkpoint, copy_sentences):
    checkpoint = load_checkpoint(trained_checkpoint)
    model, tokenizers_, _ = model_from_checkpoint(checkpoint)
    ids = [np.asarray(x, dtype=np.uint16) for x in tokenizers_.src.encode(copy_sentences(6, seed=5))]
    translator = Translator(model, tokenizers_, device="cpu")
    model.train()  # the trainer lends its model in training mode...
    results = translator.translate_ids(ids, DecodeOptions(beam_size=1, length_penalty=0.0),
                                       return_attention=True)
    assert model.training  # ...and gets it back that way
    model.eval()
    batch = collate([(x, x) for x in ids], list(range(len(ids))))
    expected = greedy_search(
        model,
        batch.src,
        batch.src_lengths,
        max_len_a=1.5,
        max_len_b=10,
        length_penalty=0.0,
        return_attention=True,
    )
    for got, want in zip(results, expected, strict=True):
        assert isinstance(got[0], Hypothesis)
        assert got[0].tokens == want[0].tokens
        assert got[0].score == pytest.approx(want[0].score, abs=1e-5)
        torch.testing.assert_close(got[0].attention, want[0].attention)
    assert translator.translate_ids([np.array([], dtype=np.int64)]) == [[Hypothesis([], 0.0, None)]]


def test_invalid_options_are_clear_errors(translator):
    with pytest.raises(ValueError, match="nbest must be between 1 and beam_size"):
        DecodeOptions(beam_size=2, nbest=3)
    with pytest.raises(ValueError, match="search must be one of"):
        DecodeOptions(search="nucleus")
    with pytest.raises(ValueError, match="top_p"):
        DecodeOptions(search="sample", top_p=0)
    with pytest.raises(ValueError, match="max_tokens must be positive"):
        Translator(translator.model, translator.tokenizers, device="cpu", max_tokens=0)
    with pytest.raises(ValueError, match="precision must be one of auto, fp32, bf16, fp16"):
        Translator(translator.model, translator.tokenizers, device="cpu", precision="fp8")
    with pytest.raises(ValueError, match="quantize must be one of none, int8"):
        Translator(translator.model, translator.tokenizers, device="cpu", quantize="int4")
    with pytest.raises(ValueError, match=r"quantize=int8 decodes a model exported .*seq2seq-export") \
            as info:
        Translator(translator.model, translator.tokenizers, device="cpu", quantize="int8")
    assert "\n" not in str(info.value)  # one line, as the command-line tools print it


@pytest.mark.parametrize("bf16_units", [True, False])
def test_auto_precision_and_the_emulated_bf16_warning(translator, monkeypatch, caplog, tmp_path,
                                                      bf16_units):
    """auto decodes in bf16 only on a CPU where bf16 measures faster (injected: 1.6x with bf16
    units, 0.25x without, where it is emulated); bf16 asked for on a CPU without bf16 units
    decodes in bf16 as asked, with a one-line warning."""
    import seq2seq.device
    import seq2seq.precision

    bf16_seconds = 0.010 if bf16_units else 0.064
    searched = []

    def injected(repetition, **budget):  # the model's greedy search runs once in each mode
        for dtype in (None, torch.bfloat16):
            repetition(dtype, 0)
            searched.append((dtype, model.training))
        return seq2seq.precision.ProbeTimes(fp32_seconds=0.016, bf16_seconds=bf16_seconds)

    monkeypatch.setattr(seq2seq.precision, "time_alternately", injected)
    monkeypatch.setenv(seq2seq.precision.CACHE_DIR_ENV, str(tmp_path))  # a cache of its own
    monkeypatch.setattr(seq2seq.device, "onednn_half_precision_kernels",
                        lambda: {"bf16": bf16_units, "fp16": False})
    monkeypatch.setattr(seq2seq.device, "_WARNED", set())
    model, tokenizers = translator.model, translator.tokenizers
    with caplog.at_level(logging.WARNING, logger="seq2seq.inference.translator"):
        auto = Translator(model, tokenizers, device="cpu", precision="auto")
        assert not caplog.records
        asked = Translator(model, tokenizers, device="cpu", precision="bf16")
        Translator(model, tokenizers, device="cpu", precision="bf16")  # warned once only
    assert searched == [(None, False), (torch.bfloat16, False)]  # in eval mode, once
    assert auto.precision == ("bf16" if bf16_units else "fp32")
    assert auto.autocast_dtype == (torch.bfloat16 if bf16_units else None)
    assert asked.autocast_dtype == torch.bfloat16
    warnings = [record.getMessage() for record in caplog.records]
    assert warnings == ([] if bf16_units else [seq2seq.device.half_precision_warning(
        "bf16", torch.device("cpu"))])


@pytest.mark.parametrize("beam_size", [1, 4])
def test_bf16_decoding_agrees_with_fp32(trained_checkpoint, copy_sentences, beam_size):
    """precision=bf16 (autocast) runs on the CPU, keeps count and order, and mostly agrees
    with fp32 (on sentences like the training data, where the model's margins are wide)."""
    inputs = copy_sentences(30, seed=321)
    inputs[7:7] = ["", "moon"]  # an empty line and a one-word line inside the batch
    options = DecodeOptions(beam_size=beam_size)
    fp32 = load_translator(trained_checkpoint)
    bf16 = load_translator(trained_checkpoint, precision="bf16")
    reference = fp32.translate(inputs, options)
    expected = [n_best[0].text for n_best in reference]
    results = bf16.translate(inputs, options, return_attention=True)
    assert len(results) == len(inputs)
    got = [n_best[0].text for n_best in results]
    # The search really ran in bf16: its scores are fp32's up to bf16 rounding, not equal.
    same = [i for i, (g, e) in enumerate(zip(got, expected, strict=True)) if g == e and g]
    differences = [abs(results[i][0].score - reference[i][0].score) for i in same]
    assert 0 < max(differences) < 0.5, differences
    assert got[7] == "" and results[7] == [Translation("", 0.0, [], [], None)]
    # In input order, and mostly what fp32 gives.
    assert sum(g == e for g, e in zip(got, expected, strict=True)) >= 27, (got, expected)
    for n_best in results[9:]:
        best = n_best[0]
        assert np.isfinite(best.score) and best.score < 0
        torch.testing.assert_close(best.attention.float().sum(-1),
                                   torch.ones(len(best.target_pieces) + 1), atol=2e-2, rtol=0)


def test_attention_heads_are_the_transformers_and_average_to_its_attention(tmp_path,
                                                                          trained_checkpoint):
    """The teacher-forced heads of each sentence's best translation average to the attention
    the search recorded: what the search saw, per layer and head."""
    from conftest import transformer_checkpoint

    translator = load_translator(transformer_checkpoint(tmp_path))
    options = DecodeOptions(beam_size=3, nbest=2)
    lines = ["red cat big house", "", "blue bird sun moon small tree"]
    results = translator.translate(lines, options, attention_heads=True)
    assert results[1][0].attention_heads is None  # an empty sentence
    for n_best in (results[0], results[2]):
        best, second = n_best
        assert second.attention_heads is None  # the page shows the best one
        heads = best.attention_heads
        assert heads.shape == (2, 2, *best.attention.shape)
        torch.testing.assert_close(heads.mean(dim=(0, 1)), best.attention.float(),
                                   atol=1e-5, rtol=1e-5)
    assert translator.translate(lines[:1], options)[0][0].attention_heads is None  # not asked
    rnn = load_translator(trained_checkpoint)
    assert rnn.translate(lines[:1], attention_heads=True)[0][0].attention_heads is None


def test_progress_counts_every_sentence_batch_by_batch(trained_checkpoint, copy_sentences):
    """What the bars of evaluate.py and compare.py count: each sentence once, empty ones
    included, one call per batch."""
    inputs = copy_sentences(9, seed=5) + ["", "  "]
    translator = load_translator(trained_checkpoint, max_tokens=30)
    counts: list[int] = []
    translator.translate(inputs, DecodeOptions(beam_size=1), progress=counts.append)
    assert sum(counts) == len(inputs)
    assert len([count for count in counts if count]) > 2  # several batches, each reported


@pytest.mark.parametrize("beam_size", [1, 3])
def test_prefixes_and_constraints_shape_every_translation(translator, beam_size):
    """The copy model asked for a word it would not copy still writes it, after the forced
    start; no constraints and no prefix translate as before; a shortlist changes nothing."""
    lines = ["red cat big house", "blue bird", "one two three"]
    options = DecodeOptions(beam_size=beam_size, nbest=beam_size)
    plain = translator.translate(lines, options)
    shaped = translator.translate(lines, options, prefixes=["green", "", "sun moon"],
                                  constraints=[["moon"], [], ["fish", "small tree"]])
    for prefix, phrases, n_best in zip(["green", "", "sun moon"],
                                       [["moon"], [], ["fish", "small tree"]], shaped,
                                       strict=True):
        for translation in n_best:
            assert translation.text.startswith(prefix)
            assert all(phrase in translation.text for phrase in phrases)
    assert [t.text for t in shaped[1]] == [t.text for t in plain[1]]
    none = translator.translate(lines, options, prefixes=[""] * 3, constraints=[[]] * 3)
    assert [[t.text for t in n] for n in none] == [[t.text for t in n] for n in plain]


def test_constrained_sentences_are_batched_with_as_many_banks(trained_checkpoint):
    """A grid beam search decodes every sentence of a batch with the batch's most banks, so
    sentences go only with those of as many, each costing its padded length times its banks;
    how they are batched does not change what they say."""
    translator = load_translator(trained_checkpoint, max_tokens=24)
    sources = [np.arange(1, n + 1) for n in (3, 3, 5, 2, 0, 3)]
    banks = [1, 3, 3, 1, 2, 3]
    batches = translator._batches(sources, banks)
    assert sorted(i for batch in batches for i in batch) == [0, 1, 2, 3, 5]  # not the empty one
    for batch in batches:
        assert len({banks[i] for i in batch}) == 1
        assert len(batch) * max((sources[i].size + 1) * banks[i] for i in batch) <= 24 \
            or len(batch) == 1
    assert [banks[batch[0]] for batch in batches] == sorted(
        (banks[batch[0]] for batch in batches), reverse=True)
    lines = ["red cat big house", "blue bird", "one two three", "sun", "green bird sun"]
    phrases = [["moon"], [], ["fish", "small tree"], ["tree"], []]
    together = load_translator(trained_checkpoint, max_tokens=4000)
    one_by_one = load_translator(trained_checkpoint, max_tokens=1)
    beam2 = DecodeOptions(beam_size=2)
    assert [n[0].text for n in together.translate(lines, beam2, constraints=phrases)] == \
        [n[0].text for n in one_by_one.translate(lines, beam2, constraints=phrases)]


def test_sampling_through_the_translator_is_seeded_and_refuses_constraints(translator):
    lines = ["red cat big house", "blue bird sun"]
    sample = DecodeOptions(search="sample", nbest=4, beam_size=1, temperature=5.0, seed=3)
    first, again = translator.translate(lines, sample), translator.translate(lines, sample)
    assert [[t.text for t in n] for n in first] == [[t.text for t in n] for n in again]
    assert all(len(n_best) == 4 for n_best in first)  # nbest beyond beam_size: fine to sample
    greedy = translator.translate(lines, DecodeOptions(beam_size=1))
    top1 = translator.translate(lines, DecodeOptions(search="sample", top_k=1, seed=0))
    assert [n[0].text for n in top1] == [n[0].text for n in greedy]
    with pytest.raises(ValueError, match="constraints and terms need search=beam"):
        translator.translate(lines, sample, constraints=[["moon"], []])


def test_the_translator_holds_no_request(translator):
    """Options travel with each call: one call's options leave the next call's alone."""
    lines = ["red cat big house", "blue bird sun"]
    default = translator.translate(lines)
    translator.translate(lines, DecodeOptions(beam_size=1, nbest=1, max_len_b=1))
    assert [[t.text for t in n] for n in translator.translate(lines)] == \
        [[t.text for t in n] for n in default]
    short = translator.translate(lines, DecodeOptions(max_len_a=0, max_len_b=1))
    assert all(len(n_best[0].target_pieces) <= 1 for n_best in short)


def test_a_phrase_the_vocabulary_cannot_write_is_one_line(translator):
    options = DecodeOptions(beam_size=2)
    with pytest.raises(ValueError, match="sentence 1: constraint 'Ž' has a piece") as raised:
        translator.translate(["red cat"], options, constraints=[["Ž"]])
    assert "\n" not in str(raised.value)
    with pytest.raises(ValueError, match="is empty"):
        translator.translate(["red cat"], options, constraints=[[""]])
