"""Output-vocabulary shortlists (seq2seq/inference/shortlist.py): building, the guarantee that
no reference piece of the training pairs is lost, decoding through one, files and the CLIs."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import api_lines

from seq2seq import CONFIG_DIR
from seq2seq.checkpoint import load_checkpoint, model_from_checkpoint
from seq2seq.cli.build_shortlist import main as build_shortlist
from seq2seq.data.text_files import read_lines
from seq2seq.inference.decode_options import DecodeOptions
from seq2seq.inference.runtimes import load_translator
from seq2seq.inference.shortlist import (
    Shortlist,
    ShortlistError,
    same_pieces,
    vocabulary_fingerprint,
)
from seq2seq.inference.translator import Translator

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}


def random_pairs(seed: int, count: int, vocab: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Pairs whose target pieces mostly depend on the source's (plus some noise)."""
    rng = np.random.default_rng(seed)
    sources, targets = [], []
    for _ in range(count):
        source = rng.integers(4, vocab, rng.integers(1, 9))
        target = (source * 7) % (vocab - 4) + 4
        noise = rng.integers(4, vocab, rng.integers(0, 3))
        sources.append(source)
        targets.append(rng.permutation(np.concatenate([target, noise])))
    return sources, targets


@pytest.mark.parametrize(("per_source", "frequent"), [(0, 0), (2, 3), (5, 0)])
def test_no_reference_piece_of_the_training_pairs_is_removed(per_source, frequent):
    sources, targets = random_pairs(0, 400, vocab=60)
    shortlist = Shortlist.build(sources, targets, src_vocab_size=60, tgt_vocab_size=60,
                                per_source=per_source, frequent=frequent)
    sizes = []
    for source, target in zip(sources, targets, strict=True):
        ids = shortlist.for_sources([source]).numpy()
        assert np.isin(target, ids).all()
        sizes.append(ids.size)
    assert np.mean(sizes) < 30  # and it does restrict the output layer
    assert shortlist.frequent.size == frequent


def test_building_in_chunks_gives_the_same_shortlist(monkeypatch):
    from seq2seq.inference import shortlist as shortlist_module

    sources, targets = random_pairs(3, 300, vocab=50)
    options = {"src_vocab_size": 50, "tgt_vocab_size": 50, "per_source": 3, "frequent": 2}
    whole = Shortlist.build(sources, targets, **options)
    monkeypatch.setattr(shortlist_module, "_CHUNK_PAIRS", 7)  # about one sentence at a time
    chunked = Shortlist.build(sources, targets, **options)
    for name in ("offsets", "candidates", "frequent"):
        np.testing.assert_array_equal(getattr(chunked, name), getattr(whole, name))


def test_candidates_are_ranked_by_co_occurrence():
    # Source 4 always comes with target 10; target 11 appears nearly everywhere.
    sources = [[4, 5], [4, 6], [4], [5], [6], [7]]
    targets = [[10, 11], [10, 11], [10], [11], [11, 12], [11]]
    shortlist = Shortlist.build(sources, targets, src_vocab_size=20, tgt_vocab_size=20,
                                per_source=1, frequent=0)

    def candidates_of(source_id: int) -> list[int]:  # beside the 4 special pieces
        return shortlist.for_sources([[source_id]]).tolist()[4:]

    assert candidates_of(4) == [10]  # Dice 1 (11: 0.5)
    assert candidates_of(5) == [11]  # 0.57 (10: 0.4)
    # 6's best is 12 (0.67); pair 2 needs 11, which goes to its source piece of best Dice
    # for it: 6 (0.57), not 4 (0.5).
    assert candidates_of(6) == [11, 12]
    assert candidates_of(8) == []  # never seen
    # Frequent pieces are always included and not repeated among the candidates.
    shortlist = Shortlist.build(sources, targets, src_vocab_size=20, tgt_vocab_size=20,
                                per_source=1, frequent=1)
    assert shortlist.frequent.tolist() == [11]
    assert 11 not in shortlist.candidates
    assert shortlist.for_sources([[7]]).tolist() == [0, 1, 2, 3, 11]


def test_special_ids_come_first_and_the_result_is_sorted():
    sources, targets = random_pairs(1, 100, vocab=40)
    shortlist = Shortlist.build(sources, targets, src_vocab_size=40, tgt_vocab_size=40,
                                per_source=2, frequent=2, same_piece=np.arange(40) - 1)
    for batch in ([], [[]], [sources[0]], sources[:10]):
        ids = shortlist.for_sources(batch)
        assert ids.dtype == torch.int64
        assert ids[:4].tolist() == [0, 1, 2, 3]
        assert torch.equal(ids, torch.unique(ids))
    assert 9 in shortlist.for_sources([[10]]).tolist()  # the same piece of source id 10
    with pytest.raises(ShortlistError, match="source ids"):
        shortlist.for_sources([[40]])


def test_save_load_round_trip_and_bad_files(tmp_path):
    sources, targets = random_pairs(2, 200, vocab=50)
    shortlist = Shortlist.build(sources, targets, src_vocab_size=50, tgt_vocab_size=50,
                                per_source=3, frequent=2, same_piece=np.full(50, -1),
                                fingerprint="abc")
    shortlist.save(tmp_path / "s.pt")
    loaded = Shortlist.load(tmp_path / "s.pt")
    for name in ("offsets", "candidates", "frequent", "same_piece"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(shortlist, name))
    assert (loaded.fingerprint, loaded.tgt_vocab_size) == ("abc", 50)
    assert torch.equal(loaded.for_sources(sources[:5]), shortlist.for_sources(sources[:5]))
    assert [p.name for p in tmp_path.iterdir()] == ["s.pt"]  # no temporary file left

    with pytest.raises(ShortlistError, match="shortlist not found"):
        Shortlist.load(tmp_path / "missing.pt")
    torch.save({"model": {}}, tmp_path / "other.pt")
    with pytest.raises(ShortlistError, match="is not a shortlist"):
        Shortlist.load(tmp_path / "other.pt")
    torch.save({"format": "seq2seq-shortlist", "x": Path("a")}, tmp_path / "pickled.pt")
    with pytest.raises(ShortlistError, match="Python objects"):
        Shortlist.load(tmp_path / "pickled.pt")
    (tmp_path / "text.pt").write_text("hello")
    with pytest.raises(ShortlistError, match="cannot read"):
        Shortlist.load(tmp_path / "text.pt")


# -- decoding through a shortlist, on the trained copy model ---------------------------------
@pytest.fixture(scope="module")
def copy_model(trained_checkpoint):
    model, tokenizers, _ = model_from_checkpoint(load_checkpoint(trained_checkpoint))
    return model.eval(), tokenizers


def copy_shortlist(trained_checkpoint, tokenizers, **options) -> Shortlist:
    corpus = trained_checkpoint.parents[1] / "corpus"
    sources = tokenizers.src.encode(read_lines(corpus / "train.src"))
    targets = tokenizers.tgt.encode(read_lines(corpus / "train.tgt"))
    return Shortlist.build(sources, targets, src_vocab_size=tokenizers.src.vocab_size,
                           tgt_vocab_size=tokenizers.tgt.vocab_size,
                           fingerprint=vocabulary_fingerprint(tokenizers), **options)


def everything(tokenizers) -> Shortlist:
    vocab = tokenizers.tgt.vocab_size
    return Shortlist(offsets=np.zeros(tokenizers.src.vocab_size + 1, np.int64), candidates=[],
                     frequent=np.arange(4, vocab), tgt_vocab_size=vocab,
                     fingerprint=vocabulary_fingerprint(tokenizers))


def assert_identical(got, expected) -> None:
    assert len(got) == len(expected)
    for n_got, n_expected in zip(got, expected, strict=True):
        assert [(t.text, t.score, t.target_pieces) for t in n_got] == [
            (t.text, t.score, t.target_pieces) for t in n_expected
        ]
        for a, b in zip(n_got, n_expected, strict=True):
            assert (a.attention is None) == (b.attention is None)
            if a.attention is not None:
                assert torch.equal(a.attention, b.attention)


@pytest.mark.parametrize(
    "options",
    [{"beam_size": 1}, {"beam_size": 4, "nbest": 3}],
    ids=["greedy", "beam-nbest"],
)
def test_a_shortlist_of_everything_changes_nothing(copy_model, copy_sentences, options):
    model, tokenizers = copy_model
    inputs = copy_sentences(12, seed=31) + ["", "red red red red red red red"]
    plain = Translator(model, tokenizers, device="cpu")
    restricted = Translator(model, tokenizers, device="cpu", shortlist=everything(tokenizers))
    assert_identical(restricted.translate(inputs, DecodeOptions(**options)),
                     plain.translate(inputs, DecodeOptions(**options)))


def test_ensembles_are_restricted_member_by_member(trained_checkpoint, copy_model, copy_sentences):
    _, tokenizers = copy_model
    inputs = copy_sentences(8, seed=32)
    pair = [trained_checkpoint, trained_checkpoint]
    plain = load_translator(pair)
    restricted = load_translator(pair, shortlist=everything(tokenizers))
    beam3 = DecodeOptions(beam_size=3)
    assert_identical(restricted.translate(inputs, beam3), plain.translate(inputs, beam3))
    # Each member's log-probabilities are renormalised over the shortlist, then averaged.
    ensemble, ids = restricted.model, torch.tensor([0, 1, 2, 3, 6, 9])
    src, src_lengths = torch.tensor([[5, 7, 8, 2]]), torch.tensor([4])
    prev = torch.tensor([2])  # shortlist position 2: BOS
    with torch.no_grad():
        encoded = ensemble.encode(src, src_lengths)
        got, _, _ = ensemble.decode_step(ids[prev], ensemble.init_state(encoded), encoded,
                                         output_ids=ids)
        expected = torch.stack([
            torch.log_softmax(member.decode_step(ids[prev], member.init_state(part), part)[0]
                              [:, ids], dim=-1)
            for member, part in zip(ensemble.members, encoded, strict=True)]).mean(0)
    torch.testing.assert_close(got, expected)


def test_a_real_shortlist_keeps_the_copies_with_a_smaller_output_layer(
    trained_checkpoint, copy_model, copy_sentences, monkeypatch
):
    model, tokenizers = copy_model
    vocab = tokenizers.tgt.vocab_size
    shortlist = copy_shortlist(trained_checkpoint, tokenizers, per_source=2, frequent=0)
    widths = []
    step = model.decode_step

    def decode_step(*args, **kwargs):  # the output layer's width at each step
        logits, weights, state = step(*args, **kwargs)
        widths.append(logits.size(-1))
        return logits, weights, state

    monkeypatch.setattr(model, "decode_step", decode_step)
    inputs = copy_sentences(30, seed=123)
    beam4 = DecodeOptions(beam_size=4)
    plain = [n[0].text for n in Translator(model, tokenizers, device="cpu")
             .translate(inputs, beam4)]
    assert widths and set(widths) == {vocab}
    widths.clear()
    restricted = Translator(model, tokenizers, device="cpu", shortlist=shortlist,
                            max_tokens=40)  # small batches: small shortlists
    got = [n[0].text for n in restricted.translate(inputs, beam4)]
    assert widths and max(widths) < vocab
    copies = [i for i, (p, x) in enumerate(zip(plain, inputs, strict=True)) if p == x]
    assert len(copies) >= 25
    assert [got[i] for i in copies] == [inputs[i] for i in copies]
    # One sentence: the specials, at most 2 candidates per piece.
    ids = shortlist.for_sources(tokenizers.src.encode(["red cat"]))
    assert ids.numel() <= 4 + 2 * 2


def test_a_shortlist_for_other_vocabularies_is_refused(copy_model):
    model, tokenizers = copy_model
    other = everything(tokenizers)
    other.fingerprint = "0123456789abcdef"
    with pytest.raises(ShortlistError, match="built for other vocabularies"):
        Translator(model, tokenizers, device="cpu", shortlist=other)
    assert same_pieces(tokenizers)[4] == 4  # joint vocabulary: each piece is itself


# -- seq2seq-build-shortlist and the command lines ----------------------------------------------
def test_build_shortlist_and_translate_cli(tmp_path, trained_checkpoint, capsys, run_python):
    corpus = trained_checkpoint.parents[1] / "corpus"
    output = tmp_path / "shortlist.pt"
    arguments = [f"checkpoint={trained_checkpoint}", f"src={corpus / 'train.src'}",
                 f"tgt={corpus / 'train.tgt'}", f"output={output}", "per_source=3", "frequent=2"]
    build_shortlist(arguments)
    assert "shortlist of one sentence" in capsys.readouterr().out
    shortlist = Shortlist.load(output)
    assert shortlist.frequent.size == 2

    # Bad input: one line, status 1, nothing written.
    # The previous release's flags, read with a warning.
    bad = ["--checkpoint", str(trained_checkpoint), "--src", str(corpus / "train.src"),
           "--tgt", str(corpus / "valid.tgt"), "--output", str(tmp_path / "x.pt")]
    with pytest.raises(SystemExit, match="1"):
        build_shortlist(bad)
    warning, err = capsys.readouterr().err.strip().split("\n", 1)
    assert warning.startswith("warning: ") and f"checkpoint={trained_checkpoint}" in warning
    assert err.startswith("error: ") and "lines" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x.pt").exists()

    command = [ROOT / "translate.py", f"checkpoint={trained_checkpoint}", "text=green bird sun",
               "device=cpu"]
    result = run_python([*command, f"shortlist={output}"], env=ENV, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    expected = api_lines(trained_checkpoint, ["green bird sun"], shortlist=Shortlist.load(output))
    assert result.stdout.splitlines() == expected
    assert "restricted by shortlist" in result.stderr
    result = run_python([*command, f"shortlist={tmp_path / 'missing.pt'}"], env=ENV, cwd=tmp_path,
                        timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: shortlist not found: {tmp_path / 'missing.pt'}"
    ]


def compose(config_name: str, overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=overrides)


def test_evaluate_records_the_shortlist_and_serve_refuses_a_missing_one(
    tmp_path, trained_checkpoint, copy_model, capsys
):
    from seq2seq.cli.decoding_request import DecodingRequest
    from seq2seq.cli.evaluate import evaluate_checkpoint

    _, tokenizers = copy_model
    path = tmp_path / "everything.pt"
    everything(tokenizers).save(path)
    corpus = trained_checkpoint.parents[1] / "corpus"
    cfg = compose("evaluate", [f"checkpoint={trained_checkpoint}", f"src={corpus / 'test.src'}",
                               f"ref={corpus / 'test.tgt'}", "beam_size=2", "device=cpu",
                               f"output_dir={tmp_path / 'eval'}", f"shortlist={path}"])
    summary = evaluate_checkpoint(Path(trained_checkpoint), cfg, DecodingRequest.of(cfg))
    assert summary["shortlist"] == str(path)

    pytest.importorskip("fastapi")
    from seq2seq.cli.serve import build_app

    cfg = compose("serve", [f"checkpoint={trained_checkpoint}", "name=copy", "device=cpu",
                            f"shortlist={tmp_path / 'missing.pt'}"])
    with pytest.raises(SystemExit) as exit_info:
        build_app(cfg)
    assert exit_info.value.code == 1
    assert capsys.readouterr().err.strip() == (
        f"error: shortlist not found: {tmp_path / 'missing.pt'}"  # read once, before a model
    )


def test_prefix_and_constraint_pieces_join_the_shortlist(trained_checkpoint, copy_model):
    """A shortlist that keeps only the special pieces still lets the search write a prefix
    and the constraints (their pieces join each batch's shortlist)."""
    _, tokenizers = copy_model
    vocab = tokenizers.tgt.vocab_size
    specials_only = Shortlist(offsets=np.zeros(tokenizers.src.vocab_size + 1, np.int64),
                              candidates=[], frequent=[], tgt_vocab_size=vocab,
                              fingerprint=vocabulary_fingerprint(tokenizers))
    translator = load_translator(trained_checkpoint, shortlist=specials_only)
    (best,), = translator.translate(["red cat"], DecodeOptions(beam_size=2), prefixes=["blue"],
                                    constraints=[["moon"]])
    assert best.text == "blue moon"
