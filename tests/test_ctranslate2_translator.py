"""translate.py, evaluate.py and serve.py on a CTranslate2 folder (``format=ctranslate2``): the
checkpoint's translations, CTranslate2 running the search, and what it cannot do refused in one
line (seq2seq.inference.ctranslate2_translator).

Every comparison is between the folder and the checkpoint it was exported from, a random tiny
Transformer, on what CTranslate2 promises: greedy search's translations (cut at each sentence's
own limit), the scores of the pieces it finds, batched = alone where that holds. Its ``<pad>``
and ``<s>`` logits are pushed far down, as training leaves them: CTranslate2 renormalizes its
log-probabilities without those two pieces where our searches do not, so with them probable (an
untouched random model) only greedy outputs would be the same, with them improbable the scores
are the same too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("ctranslate2")

from conftest import api_lines, transformer_checkpoint  # noqa: E402

from seq2seq.checkpoint import CheckpointError  # noqa: E402
from seq2seq.cli.translate import format_translations  # noqa: E402
from seq2seq.export import export_checkpoint  # noqa: E402
from seq2seq.inference.ctranslate2_translator import (  # noqa: E402
    ATTENTION_SOURCE,
    PHRASE_REFUSAL,
    CTranslate2Translator,
)
from seq2seq.inference.decode_options import DecodeOptions  # noqa: E402
from seq2seq.inference.model_files import load_model_payload, model_from_payload  # noqa: E402
from seq2seq.inference.runtimes import load_translator  # noqa: E402
from seq2seq.inference.translator import Translator  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
# The last two reach the output limit of max_len_b=4 below.
LINES = ["red cat", "", "one two big house", "blue bird sun", "moon", "small tree green dog",
         "fish car two", "big big big house tree"]


def both(exported, **settings) -> tuple[Translator, CTranslate2Translator]:
    checkpoint, folder = exported
    return (load_translator(checkpoint, "cpu", **settings),
            load_translator(folder, "cpu", **settings))


def assert_same_translations(got, want, *, score_tolerance: float = 1e-4) -> None:
    """Two translate() results: the same n-best texts and pieces, scores within tolerance."""
    assert [[t.text for t in n_best] for n_best in got] == \
        [[t.text for t in n_best] for n_best in want]
    for have, expected in zip(got, want, strict=True):
        for a, b in zip(have, expected, strict=True):
            assert a.target_pieces == b.target_pieces and a.source_pieces == b.source_pieces
            assert a.score == pytest.approx(b.score, abs=score_tolerance)


def assert_attention_shapes(results) -> None:
    """One attention row per target piece and EOS, one column per source piece and EOS, each
    row summing to 1 (CTranslate2's alignment head, its EOS column restored)."""
    for n_best in results:
        for t in n_best:
            if not t.source_pieces:
                assert t.attention is None
                continue
            assert t.attention.shape == (len(t.target_pieces) + 1, len(t.source_pieces) + 1)
            torch.testing.assert_close(t.attention.sum(dim=1), torch.ones(len(t.attention)))


def test_the_runtime_is_chosen_where_loading_happens(exported):
    checkpoint, folder = exported
    translator = load_translator(folder, "auto")  # auto: the CPU, as ONNX's
    assert isinstance(translator, CTranslate2Translator)
    assert translator.device == torch.device("cpu") and translator.quantize == "none"
    assert translator.parameter_count == load_translator(checkpoint).parameter_count
    # What makes one of our models of a payload names the folder in one line.
    with pytest.raises(CheckpointError, match=r"ct2 is a CTranslate2 folder: it decodes alone, "
                                              r"in translate.py, evaluate.py and serve.py"):
        model_from_payload(load_model_payload(folder), "cpu")


@pytest.mark.parametrize("options", [
    DecodeOptions(beam_size=1),
    DecodeOptions(beam_size=1, length_penalty=0.0, max_len_a=0.0, max_len_b=2.0),
    DecodeOptions(beam_size=1, max_len_a=0.0, max_len_b=0.0),  # only the EOS step
], ids=["greedy", "greedy-at-the-limit", "no-output-step"])
def test_greedy_search_translates_as_the_checkpoint(exported, options):
    """Greedy search: the checkpoint's pieces, each cut at its own limit, with attention; the
    scores of those that ended before their limit (a cut one keeps CTranslate2's score of the
    longer search it was cut from)."""
    translator, folder_translator = both(exported)
    want = translator.translate(LINES, options)
    got = folder_translator.translate(LINES, options)
    assert [[t.target_pieces for t in n] for n in got] == \
        [[t.target_pieces for t in n] for n in want]
    limit = int(options.max_len_b)
    for have, expected in zip(got, want, strict=True):
        if options.max_len_a or len(have[0].target_pieces) < limit:
            assert have[0].score == pytest.approx(expected[0].score, abs=1e-4)
    if options.max_len_a == 0.0:
        assert any(len(n[0].target_pieces) == limit for n in got if n[0].source_pieces)
    assert_attention_shapes(got)


def counted_calls(translator: CTranslate2Translator) -> list[dict]:
    """Records each ``translate_batch`` call of ``translator`` (its row count and options)."""
    calls = []
    translate_batch = translator.engine.translate_batch

    def counted(sources, *args, **options):
        calls.append({"rows": len(sources), **options})
        return translate_batch(sources, *args, **options)

    translator.engine = type("Counted", (), {"translate_batch": staticmethod(counted)})()
    return calls


@pytest.mark.parametrize("options", [
    DecodeOptions(beam_size=1, max_len_a=1.0, max_len_b=1.0),
    DecodeOptions(search="sample", top_k=1, max_len_a=1.0, max_len_b=1.0),  # greedy, drawn
], ids=["greedy", "sample-top1"])
def test_one_call_per_batch_and_batched_equals_alone(exported, options):
    """A batch is one translate_batch call, under its longest output limit (plus the step
    where a cut hypothesis' EOS would be), with CTranslate2's own options; each sentence cut to
    its own limit afterwards, so greedy search gives each sentence's translation alone."""
    folder_translator = load_translator(exported[1])
    calls = counted_calls(folder_translator)
    got = folder_translator.translate(LINES, options, return_attention=False)
    pieces = [len(folder_translator.tokenizers.src.encode([line])[0]) for line in LINES if line]
    (call,) = calls
    assert call["rows"] == len(pieces)
    assert call["max_decoding_length"] == max(pieces) + 2 + 1  # floor(1.0 * (n + 1) + 1.0) + 1
    assert call["beam_size"] == 1 and call["length_penalty"] == options.length_penalty
    alone = [folder_translator.translate([line], options, return_attention=False)[0]
             for line in LINES]
    assert [[t.target_pieces for t in n] for n in got] == \
        [[t.target_pieces for t in n] for n in alone]
    assert any(len(n[0].target_pieces) == len(n[0].source_pieces) + 2 for n in got
               if n[0].source_pieces)  # some reached their own limit and were cut there


@pytest.mark.parametrize("nbest", [1, 3])
def test_beam_search_is_ctranslate2s_scored_under_our_length_penalty(exported, nbest):
    """CTranslate2's beam search and n-best list, re-ranked under our GNMT penalty: a score is
    what the checkpoint gives the same pieces (its summed log-probability over the GNMT factor),
    and the best translation with length_penalty=0 is the checkpoint's."""
    translator, folder_translator = both(exported)
    options = DecodeOptions(beam_size=4, nbest=nbest, length_penalty=0.6, max_len_b=30.0)
    got = folder_translator.translate(LINES, options)
    assert_attention_shapes(got)
    # The first step reads only BOS and the source: every hypothesis' first attention row is
    # greedy search's (CTranslate2 up to 4.8 gets it wrong in a batch: FIRST_ROW_FIXED_IN).
    greedy = folder_translator.translate(LINES, DecodeOptions(beam_size=1))
    for n_best, (first,) in zip(got, greedy, strict=True):
        for t in n_best:
            if t.attention is not None:
                torch.testing.assert_close(t.attention[0], first.attention[0])
    sources = translator.tokenizers.src.encode(LINES)
    found = folder_translator.translate_ids(sources, options)
    for n_best, hypotheses, source in zip(got, found, sources, strict=True):
        assert len(n_best) == (nbest if source else 1)
        assert [t.score for t in n_best] == sorted((t.score for t in n_best), reverse=True)
        for hypothesis in hypotheses:  # the checkpoint's score of these very pieces, forced
            if source and len(hypothesis.tokens) < 30:
                forced = DecodeOptions(beam_size=1, length_penalty=0.6, max_len_a=0.0,
                                       max_len_b=len(hypothesis.tokens))
                (want,), = translator.translate_ids([source], forced,
                                                    prefixes=[hypothesis.tokens])
                assert want.tokens == hypothesis.tokens
                assert want.score == pytest.approx(hypothesis.score, abs=1e-4)
    plain = DecodeOptions(beam_size=4, length_penalty=0.0)
    assert [n[0].text for n in folder_translator.translate(LINES, plain)] == \
        [n[0].text for n in translator.translate(LINES, plain)]


def test_a_prefix_is_kept(exported):
    """Every translation starts with its prefix: greedy search writes the checkpoint's pieces
    after it (the score counts the pieces after the prefix: CTranslate2 scores forced pieces
    0)."""
    prefixes = ["red", "", "one two", "blue bird sun moon", "", "small", "", "big big big"]
    translator, folder_translator = both(exported)
    greedy = DecodeOptions(beam_size=1)
    assert [[t.text for t in n] for n in folder_translator.translate(
        LINES, greedy, prefixes=prefixes)] == [[t.text for t in n] for n in translator.translate(
            LINES, greedy, prefixes=prefixes)]
    beam = folder_translator.translate(LINES, DecodeOptions(beam_size=4, nbest=2),
                                       prefixes=prefixes)
    for n_best, prefix, line in zip(beam, prefixes, LINES, strict=True):
        assert len(n_best) == (2 if line else 1)
        assert all(t.text.startswith(prefix) for t in n_best if line)


def test_sampling_maps_its_options_and_a_seed_repeats_a_fresh_run(exported):
    """temperature, top_k and top_p are CTranslate2's; a seed seeds a worker's generator
    when it first samples, so two fresh runs of the same seeded call draw the same samples."""
    checkpoint, folder = exported
    sample = DecodeOptions(search="sample", nbest=3, seed=5, temperature=1.5, top_p=0.9)
    first = load_translator(folder).translate(LINES, sample)
    again = load_translator(folder).translate(LINES, sample)
    assert [[t.text for t in n] for n in first] == [[t.text for t in n] for n in again]
    assert all(len(n_best) == 3 for n_best, line in zip(first, LINES, strict=True) if line)
    assert all([t.score for t in n] == sorted((t.score for t in n), reverse=True) for n in first)
    # top_k=1 draws the most probable piece: greedy search, with its scores.
    greedy = load_translator(checkpoint).translate(LINES, DecodeOptions(beam_size=1))
    assert_same_translations(load_translator(folder).translate(
        LINES, DecodeOptions(search="sample", top_k=1)), greedy)


@pytest.mark.parametrize(("settings", "message"), [
    ({"precision": "bf16"}, "precision=bf16: a CTranslate2 folder decodes in the types it was "
                            "exported with"),
    ({"quantize": "int8"}, "quantize=int8 decodes a folder exported with quantize=int8"),
    ({"device": "cuda"}, "device=cuda: a CTranslate2 folder decodes on the CPU here"),
    ({"shortlist": object()}, "shortlist: a CTranslate2 folder scores its whole target vocabulary"),
    ({"max_source_length": 2000}, "max_source_length=2000: the CTranslate2 folder's position "
                                  "table holds 1024 source positions"),
])
def test_what_the_folder_cannot_load_with_is_refused_in_one_line(exported, settings, message):
    with pytest.raises(ValueError) as error:
        load_translator(exported[1], **settings)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


@pytest.mark.parametrize(("options", "message"), [
    ({"search": "sample", "epsilon": 0.1}, "epsilon=0.1: a CTranslate2 folder samples with "
                                           "temperature, top_k and top_p only"),
    ({"max_len_a": 10.0}, "max_len_a=10.0, max_len_b=10.0: a source of max_source_length=250 "
                          "pieces may get 2520 output pieces"),
])
def test_what_ctranslate2_cannot_decode_is_refused_in_one_line(exported, options, message):
    translator = load_translator(exported[1])
    with pytest.raises(ValueError) as error:
        translator.check(DecodeOptions(**options))
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
    with pytest.raises(ValueError, match=message.split(":")[0]):
        translator.translate(["red cat"], DecodeOptions(**options))


def test_what_ctranslate2_does_differently_is_declared_and_logged_when_opened(exported, caplog):
    from seq2seq.inference.ctranslate2_translator import CTranslate2Translator
    from seq2seq.inference.runtimes import open_model

    checkpoint, folder = exported
    with caplog.at_level("INFO", logger="seq2seq.inference.runtimes"):
        open_model(checkpoint)
        assert caplog.messages == []  # our searches: nothing to say
        open_model(folder)
    assert caplog.messages == [f"{folder} decodes with CTranslate2Translator: {difference}"
                               for difference in CTranslate2Translator.differs]
    assert len(CTranslate2Translator.differs) >= 3


def test_phrases_and_ensembles_are_refused_in_one_line(exported):
    checkpoint, folder = exported
    translator = load_translator(folder)
    with pytest.raises(ValueError, match=f"^{PHRASE_REFUSAL}$"):
        translator.translate(["red cat"], constraints=[["dog"]])
    assert translator.translate(["red cat"], constraints=[[]])  # no phrase: nothing to refuse
    with pytest.raises(ValueError, match=r"ct2 is a CTranslate2 folder, which decodes alone"):
        load_translator([checkpoint, folder])


def test_translate_py_reads_the_folder(exported, run_python, tmp_path):
    checkpoint, folder = exported
    stdin = "".join(f"{line}\n" for line in LINES)
    for options in ({"beam_size": 1}, {"beam_size": 5, "nbest": 3}):
        result = run_python([ROOT / "translate.py", f"checkpoint={folder}",
                             *(f"{key}={value}" for key, value in options.items())],
                            input=stdin, cwd=tmp_path, env=ENV, timeout=120)
        assert result.returncode == 0, result.stderr
        nbest = options.get("nbest", 1)
        got = result.stdout.splitlines()
        if nbest == 1:  # greedy: the checkpoint's
            assert got == api_lines(checkpoint, LINES, device="cpu", **options)
            continue
        folder_translator = load_translator(folder)
        assert got == [line for n_best in folder_translator.translate(
            LINES, DecodeOptions(**options), return_attention=False)
            for line in format_translations(n_best, nbest=nbest)]
    phrases = tmp_path / "phrases.txt"
    phrases.write_text("dog\n", encoding="utf-8")
    refused = run_python([ROOT / "translate.py", f"checkpoint={folder}", "text=red cat",
                          f"constraints={phrases}"], cwd=tmp_path, env=ENV, timeout=120)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == f"error: {PHRASE_REFUSAL}"


def test_evaluate_py_scores_the_folder_as_the_checkpoint(exported, run_python, tmp_path):
    checkpoint, folder = exported
    summaries = {}
    for name, path in (("checkpoint", checkpoint), ("folder", folder)):
        result = run_python([ROOT / "evaluate.py", f"checkpoint={path}", "beam_size=1",
                             f"output_dir={tmp_path / name}"],
                            cwd=checkpoint.parent, env=ENV, timeout=120)
        assert result.returncode == 0, result.stderr
        (summary,) = (tmp_path / name).glob("*.json")
        summaries[name] = json.loads(summary.read_text())
    assert summaries["folder"]["bleu"] == summaries["checkpoint"]["bleu"]
    assert summaries["folder"]["quantize"] == "none" and summaries["folder"]["device"] == "cpu"
    hypotheses = {name: Path(s["hypotheses"]).read_text() for name, s in summaries.items()}
    assert hypotheses["folder"] == hypotheses["checkpoint"]


def test_bench_decoding_times_the_folder_through_the_same_translator(exported, run_python,
                                                                      tmp_path):
    """make bench's CTranslate2 rows: benchmarks.bench_decoding on the folder decodes as
    translate.py does, so its BLEU is the checkpoint's."""
    checkpoint, folder = exported
    rows = {}
    for name, path in (("checkpoint", checkpoint), ("folder", folder)):
        result = run_python(["-m", "benchmarks.bench_decoding", "--checkpoint", str(path),
                             "--split", "valid", "--beam-sizes", "1", "3", "--device", "cpu",
                             "--num-threads", "1", "--json", str(tmp_path / f"{name}.json")],
                            cwd=checkpoint.parent, env={**ENV, "PYTHONPATH": str(ROOT)},
                            timeout=120)
        assert result.returncode == 0, result.stderr
        rows[name] = json.loads((tmp_path / f"{name}.json").read_text())["results"]
    assert [row["search"] for row in rows["folder"]] == ["greedy", "beam3"]
    assert rows["folder"][0]["bleu"] == rows["checkpoint"][0]["bleu"]
    assert all(row["sentences_per_second"] > 0 for row in rows["folder"])


def serve_config(*overrides: str):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from seq2seq import CONFIG_DIR

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return compose(config_name="serve", overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()


def test_serve_py_serves_the_folder_as_the_checkpoint(exported, tmp_path, capsys):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from seq2seq.cli.serve import build_app

    checkpoint, folder = exported
    models = f"models={{folder: {folder}, checkpoint: {checkpoint}}}"
    with TestClient(build_app(serve_config(models, "device=cpu", "beam_size=1"))) as client:
        described = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
        assert described["folder"]["attention"] == ATTENTION_SOURCE
        assert described["checkpoint"]["attention"] is None
        assert described["folder"]["scorer"] == "TransformerDecoder"
        assert described["folder"]["defaults"]["beam_size"] == 1
        bodies = {}
        for name in ("folder", "checkpoint"):
            response = client.post("/v1/translate", json={
                "text": LINES, "model": name, "attention": True, "attention_heads": True})
            assert response.status_code == 200, response.text
            bodies[name] = response.json()["translations"]
        for got, want in zip(bodies["folder"], bodies["checkpoint"], strict=True):
            assert [h["text"] for h in got["hypotheses"]] == \
                [h["text"] for h in want["hypotheses"]]
            best = got["hypotheses"][0]
            assert "attention_heads" not in best  # CTranslate2 gives one matrix
            if best["attention"] is not None:
                assert len(best["attention"]) == len(best["target_pieces"]) + 1
                assert len(best["attention"][0]) == len(got["source_pieces"]) + 1
        for request, error in (
                ({"constraints": [["dog"]]}, f"constraints: {PHRASE_REFUSAL}"),
                ({"search": "sample", "epsilon": 0.1},
                 "epsilon=0.1: a CTranslate2 folder samples with temperature, top_k and top_p "
                 "only: give epsilon=0")):
            refused = client.post("/v1/translate", json={"text": ["red cat"], "model": "folder",
                                                         **request})
            assert refused.status_code == 422 and refused.json()["error"] == error
    terms = tmp_path / "terms.tsv"
    terms.write_text("cat\tdog\n", encoding="utf-8")
    with pytest.raises(SystemExit):
        build_app(serve_config(f"checkpoint={folder}", "name=folder", f"terms={terms}"))
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        f"error: model folder: {PHRASE_REFUSAL}"


def test_an_untouched_random_transformer_gives_the_checkpoints_greedy_output(tmp_path):
    """With <pad> and <s> as probable as a random model makes them, CTranslate2's scores are
    renormalized without them, but its greedy translations are still the checkpoint's."""
    checkpoint = transformer_checkpoint(tmp_path)
    export_checkpoint(checkpoint, tmp_path / "ct2", format="ctranslate2")
    greedy = DecodeOptions(beam_size=1)
    want = load_translator(checkpoint).translate(LINES, greedy)
    got = load_translator(tmp_path / "ct2").translate(LINES, greedy)
    assert [[t.target_pieces for t in n] for n in got] == [[t.target_pieces for t in n]
                                                            for n in want]


def test_an_int8_folder_decodes_with_quantize_int8(exported, tmp_path):
    """An int8 export runs CTranslate2's int8 kernels, asked for or not, and says so. (A random
    tiny model's int8 translations are far from its float ones: closeness is make bench's.)"""
    checkpoint, _ = exported
    export_checkpoint(checkpoint, tmp_path / "int8", format="ctranslate2", quantize="int8")
    for asked in ("int8", "none"):
        translator = load_translator(tmp_path / "int8", quantize=asked)
        assert translator.quantize == "int8"
        assert [len(n_best) for n_best in translator.translate(
            LINES, DecodeOptions(beam_size=2))] == [1] * len(LINES)
