"""Searches registered by name (seq2seq/inference/searches.py): one defined here reaches every
door that takes ``search=`` (the library, translate.py's and evaluate.py's ``run``,
tune-decoding's grid, the server's ``/v1/translate``) with no library file edited, and a
runtime that runs its own searches refuses it in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from seq2seq.inference.decode_options import DecodeOptions
from seq2seq.inference.runtimes import load_translator
from seq2seq.inference.search_loop import Beam, run_search
from seq2seq.inference.searches import SEARCHES, Search, loop_settings, register_search


class TwoWidths(Search):
    """Beam search at K and at 2K beams; each sentence keeps the ``nbest`` best of the two
    searches' hypotheses (the same output once, the higher score first)."""

    calls = 0

    def rows(self, options) -> int:
        return 2 * options.beam_size

    def run(self, model, src, src_lengths, options, **guidance):
        type(self).calls += 1
        settings = loop_settings(options, **guidance)
        narrow, wide = (run_search(model, src, src_lengths, Beam(width), nbest=options.nbest,
                                   **settings)
                        for width in (options.beam_size, 2 * options.beam_size))
        kept = []
        for found in zip(narrow, wide, strict=True):
            unique = {}
            for hypothesis in sorted(found[0] + found[1], key=lambda h: -h.score):
                unique.setdefault(tuple(hypothesis.tokens), hypothesis)
            kept.append(list(unique.values())[: options.nbest])
        return kept


@pytest.fixture
def two_widths():
    """``search=two_widths`` registered for the test, and gone after it."""
    register_search("two_widths")(TwoWidths)
    TwoWidths.calls = 0
    yield TwoWidths
    del SEARCHES["two_widths"]


def compose(tool: str, overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from seq2seq import CONFIG_DIR

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return hydra_compose(config_name=tool, overrides=overrides)
    finally:
        GlobalHydra.instance().clear()


def best_of_two_widths(translator, lines: list[str], beam_size: int) -> list[str]:
    """What two_widths must give: per line, the better of beam K's and beam 2K's best."""
    narrow, wide = (translator.translate(lines, DecodeOptions(beam_size=width))
                    for width in (beam_size, 2 * beam_size))
    return [max(a[0], b[0], key=lambda t: t.score).text for a, b in zip(narrow, wide, strict=True)]


def test_a_search_registered_in_a_test_decodes_through_every_door(
        two_widths, trained_checkpoint, copy_sentences, tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from seq2seq.cli import evaluate, translate
    from seq2seq.cli.serve import build_app
    from seq2seq.cli.tune_decoding import tune

    lines = copy_sentences(6, seed=11)
    translator = load_translator(trained_checkpoint, "cpu")
    expected = best_of_two_widths(translator, lines, 2)
    options = DecodeOptions(search="two_widths", beam_size=2)
    assert options.label == "two_widths 2"

    # The library.
    got = translator.translate(lines, options)
    assert [n_best[0].text for n_best in got] == expected
    assert two_widths.calls > 0

    # translate.py's run, on the config its Hydra app composes.
    source = tmp_path / "input.txt"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    output, calls = tmp_path / "output.txt", two_widths.calls
    translate.run(compose("translate", [
        f"checkpoint={trained_checkpoint}", f"input={source}", f"output={output}",
        "search=two_widths", "beam_size=2", "device=cpu"]))
    assert output.read_text(encoding="utf-8").splitlines() == expected
    assert two_widths.calls > calls

    # evaluate.py's run: the search names its files.
    calls = two_widths.calls
    summary = evaluate.run(compose("evaluate", [
        f"checkpoint={trained_checkpoint}", f"src={source}", f"ref={source}",
        "search=two_widths", "beam_size=2", "device=cpu", f"output_dir={tmp_path / 'eval'}"]))[0]
    assert summary["search"] == "two_widths" and summary["search_label"] == "two_widths 2"
    assert Path(summary["hypotheses"]).name.endswith(".two_widths2.hyp")
    assert Path(summary["hypotheses"]).read_text(encoding="utf-8").splitlines() == expected
    assert two_widths.calls > calls

    # seq2seq-tune-decoding's grid.
    calls = two_widths.calls
    (cell,) = tune(translator, lines, expected, [2], [1.0], search="two_widths")
    assert cell["bleu"] == pytest.approx(100.0) and two_widths.calls > calls

    # The server: a request names it.
    calls = two_widths.calls
    config = compose("serve", [f"checkpoint={trained_checkpoint}", "name=copy", "device=cpu"])
    limit = config.limits.max_beam_size
    app = build_app(config)
    with TestClient(app) as client:
        answer = client.post("/v1/translate", json={"text": lines, "search": "two_widths",
                                                    "beam_size": 2})
        unknown = client.post("/v1/translate", json={"text": lines, "search": "widest"})
        # Its rows, not the beam_size asked for, meet the server's limit.
        too_wide = client.post("/v1/translate", json={"text": lines, "search": "two_widths",
                                                      "beam_size": limit // 2 + 1})
    assert answer.status_code == 200, answer.text
    assert answer.json()["search"] == "two_widths"
    assert [t["text"] for t in answer.json()["translations"]] == expected
    assert two_widths.calls > calls
    assert unknown.status_code == 422
    assert unknown.json()["error"] == ("search must be one of beam, sample, two_widths, "
                                       "got 'widest'")
    assert too_wide.status_code == 422
    assert too_wide.json()["error"] == (
        f"search=two_widths keeps {2 * (limit // 2 + 1)} hypotheses a sentence with these "
        f"options; at most {limit}")


def test_a_registered_search_is_checked_once_with_the_options(two_widths):
    with pytest.raises(ValueError, match="^search must be one of beam, sample, two_widths, "
                                         "got 'widest'$"):
        DecodeOptions(search="widest")
    # Phrases are refused for a search that cannot force them, naming the one that can.
    with pytest.raises(ValueError, match=r"^constraints and terms need search=beam \(this "
                                         r"search cannot promise a phrase\)$"):
        DecodeOptions(search="two_widths").check_phrases()
    DecodeOptions(search="beam").check_phrases()
    assert not DecodeOptions(search="two_widths", seed=1).seeded  # it draws nothing
    assert DecodeOptions(search="sample", seed=1).seeded
    # A name is one class's: another class cannot take it.
    with pytest.raises(ValueError, match="^search 'two_widths' is registered already"):
        register_search("two_widths")(type("Other", (Search,), {}))
    # A name is part of evaluate.py's file names: no path in it.
    with pytest.raises(ValueError, match="^a search's name is letters, digits and _, got 'a/b'$"):
        register_search("a/b")


def test_ctranslate2_refuses_a_search_it_does_not_run_in_one_line(two_widths, exported):
    checkpoint, folder = exported
    ours = load_translator(checkpoint, "cpu")
    ct2 = load_translator(folder, "cpu")
    options = DecodeOptions(search="two_widths", beam_size=2)
    assert len(ours.translate(["a b"], options)) == 1  # our runtime runs every registered one
    with pytest.raises(ValueError) as refused:
        ct2.translate(["a b"], options)
    assert str(refused.value) == ("search=two_widths: a CTranslate2 folder runs its own beam and "
                                  "sample searches only: use the checkpoint or an ONNX export "
                                  "for others")
    assert two_widths.calls == 1


def test_a_registered_search_gets_the_shortlist_and_the_prefixes(two_widths, trained_checkpoint,
                                                                  copy_sentences, monkeypatch):
    """What the translator hands a search (a shortlist's output ids, prefixes as positions)
    reaches the loop through loop_settings: the output layer shrinks, and every translation
    starts with its prefix (the shortlist's positions come back as the model's ids)."""
    from test_shortlist import copy_shortlist

    plain = load_translator(trained_checkpoint, "cpu")
    shortlist = copy_shortlist(trained_checkpoint, plain.tokenizers, per_source=2, frequent=0)
    shortlisted = load_translator(trained_checkpoint, "cpu", shortlist=shortlist, max_tokens=40)
    widths, step = [], shortlisted.model.decode_step

    def decode_step(*args, **kwargs):
        logits, weights, state = step(*args, **kwargs)
        widths.append(logits.size(-1))
        return logits, weights, state

    monkeypatch.setattr(shortlisted.model, "decode_step", decode_step)
    lines = copy_sentences(12, seed=5)
    prefixes = [line.split()[-1] for line in lines]  # a word the copy model writes, out of place
    options = DecodeOptions(search="two_widths", beam_size=2)
    got = shortlisted.translate(lines, options, prefixes=prefixes)
    assert widths and max(widths) < plain.tokenizers.tgt.vocab_size
    assert all(n_best[0].text.startswith(prefix) for n_best, prefix in
               zip(got, prefixes, strict=True))
