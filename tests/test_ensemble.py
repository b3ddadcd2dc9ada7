"""Ensemble decoding (seq2seq/inference/ensemble.py) through the searches, the Translator and
the command lines."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TINY_VOCAB, beam_search, greedy_search, random_transformer_model

from seq2seq.checkpoint import load_checkpoint, save_checkpoint, tokenizers_to_payload
from seq2seq.data.tokenizer import SentencePieceTokenizer, Tokenizers
from seq2seq.data.vocab import EOS_ID, PAD_ID
from seq2seq.inference.decode_options import DecodeOptions
from seq2seq.inference.ensemble import Ensemble, check_same_vocabularies
from seq2seq.inference.runtimes import load_translator
from seq2seq.inference.translator import Translator
from seq2seq.models.build import build_model

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
LIMITS = {"max_len_a": 1.5, "max_len_b": 4}


def random_batch(seed: int, lengths: list[int], vocab: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    """Source ids (B, S) ending in EOS, padded; and their lengths (B,)."""
    generator = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD_ID, dtype=torch.long)
    for row, length in enumerate(lengths):
        src[row, : length - 1] = torch.randint(4, vocab, (length - 1,), generator=generator)
        src[row, length - 1] = EOS_ID
    return src, torch.tensor(lengths)


def assert_same_hypotheses(a, b) -> None:
    assert len(a) == len(b)
    for n_best_a, n_best_b in zip(a, b, strict=True):
        assert [h.tokens for h in n_best_a] == [h.tokens for h in n_best_b]
        for ha, hb in zip(n_best_a, n_best_b, strict=True):
            assert ha.score == pytest.approx(hb.score, abs=1e-4)
            if ha.attention is not None:
                torch.testing.assert_close(ha.attention, hb.attention, atol=1e-5, rtol=1e-4)


def test_ensemble_of_one_equals_the_model(tiny_model):
    model = tiny_model(seed=3).eval()
    ensemble = Ensemble([model]).eval()
    src, lengths = random_batch(0, [7, 3, 5, 9])
    for search, options in ((greedy_search, {}), (beam_search, {"beam_size": 4, "nbest": 3})):
        expected = search(model, src, lengths, return_attention=True, **LIMITS, **options)
        got = search(ensemble, src, lengths, return_attention=True, **LIMITS, **options)
        assert_same_hypotheses(got, expected)


def first_steps(models, src, lengths, prev):
    """The ensemble's first decoder step and each member's: (log-probs, attention) pairs, and
    the ensemble's state."""
    ensemble = Ensemble(models).eval()
    with torch.inference_mode():
        encoded = ensemble.encode(src, lengths)
        log_probs, weights, state = ensemble.decode_step(prev, ensemble.init_state(encoded), encoded)
        members = []
        for model in models:
            member_encoded = model.encode(src, lengths)
            logits, member_weights, _ = model.decode_step(
                prev, model.init_state(member_encoded), member_encoded
            )
            members.append((torch.log_softmax(logits, -1), member_weights))
    return (log_probs, weights), members, state


def test_two_models_average_log_probs_and_attention(tiny_model):
    src, lengths = random_batch(1, [6, 4])
    (log_probs, weights), members, state = first_steps(
        [tiny_model(seed=1).eval(), tiny_model(seed=2).eval()], src, lengths, torch.tensor([5, 7]))
    torch.testing.assert_close(log_probs, (members[0][0] + members[1][0]) / 2)
    torch.testing.assert_close(weights, (members[0][1] + members[1][1]) / 2)
    assert {name.split(".")[0] for name in state} == {"0", "1"} and "1.hidden" in state


def test_two_model_ensemble_is_batched_and_beam_one_is_greedy(tiny_model):
    ensemble = Ensemble([tiny_model(seed=1), tiny_model(seed=2)]).eval()
    lengths = [8, 3, 6, 5]
    src, src_lengths = random_batch(2, lengths)
    batched = beam_search(ensemble, src, src_lengths, beam_size=3, nbest=2,
                          return_attention=True, **LIMITS)
    for row, length in enumerate(lengths):
        alone = beam_search(ensemble, src[row : row + 1, :length], src_lengths[row : row + 1],
                            beam_size=3, nbest=2, return_attention=True, **LIMITS)
        assert_same_hypotheses([batched[row]], alone)
    greedy = greedy_search(ensemble, src, src_lengths, **LIMITS)
    beam_one = beam_search(ensemble, src, src_lengths, beam_size=1, **LIMITS)
    assert_same_hypotheses(beam_one, greedy)


def test_a_transformer_and_an_rnn_decode_as_one_ensemble(tiny_model):
    """Members of both families: the ensemble's step is their averaged log-probs, and its beam
    search is batched = alone."""
    rnn = tiny_model(seed=1).eval()
    transformer = random_transformer_model(vocab=TINY_VOCAB, seed=2).eval()
    src, lengths = random_batch(3, [6, 4, 7])
    (log_probs, _), members, _ = first_steps([transformer, rnn], src, lengths,
                                             torch.tensor([5, 7, 9]))
    torch.testing.assert_close(log_probs, (members[0][0] + members[1][0]) / 2)
    ensemble = Ensemble([transformer, rnn]).eval()
    batched = beam_search(ensemble, src, lengths, beam_size=3, nbest=2, **LIMITS)
    for row, length in enumerate(lengths.tolist()):
        alone = beam_search(ensemble, src[row : row + 1, :length], lengths[row : row + 1],
                            beam_size=3, nbest=2, **LIMITS)
        assert_same_hypotheses([batched[row]], alone)


@pytest.fixture(scope="module")
def weak_members(tmp_path_factory, make_checkpoint) -> list[Path]:
    """Two copy-task checkpoints with fixed random weights and different scorers."""
    root = tmp_path_factory.mktemp("members")
    return [
        make_checkpoint(root / "additive", attention="additive"),
        make_checkpoint(root / "dot", attention="dot", decoder_hidden_size=64),
    ]


def test_translator_of_a_list_of_checkpoints_decodes_their_ensemble(weak_members,
                                                                     copy_sentences):
    """``load_translator([a, b])`` translates as the Ensemble of a's and b's models
    does, and unlike either member alone."""
    sources = copy_sentences(12, seed=11)
    ensemble = load_translator(weak_members)
    assert isinstance(ensemble.model, Ensemble)
    members = [load_translator(path) for path in weak_members]
    by_hand = Translator(Ensemble([m.model for m in members]), members[0].tokenizers,
                         device="cpu")

    def texts(translator: Translator) -> list[str]:
        return [n[0].text for n in translator.translate(sources, DecodeOptions(beam_size=3),
                                                        return_attention=False)]

    got = texts(ensemble)
    assert got == texts(by_hand)
    assert all(got != texts(member) for member in members)
    # Attention output keeps its shape: target pieces + EOS by source pieces + EOS.
    (best,) = ensemble.translate(["red cat sun"])[0]
    assert best.attention.shape == (len(best.target_pieces) + 1, 4)
    torch.testing.assert_close(best.attention.sum(-1), torch.ones(best.attention.shape[0]))


def other_vocabulary_checkpoint(trained_checkpoint: Path, directory: Path) -> Path:
    """A model like the copy model but with its own (smaller) sentencepiece vocabulary."""
    checkpoint = load_checkpoint(trained_checkpoint)
    words = ["red cat", "blue dog", "green tree", "big house", "one two", "sun moon fish"] * 30
    tokenizer = SentencePieceTokenizer.train(words, model_type="unigram", vocab_size=30, seed=1,
                                             max_sentences=0)
    size = tokenizer.vocab_size
    model = build_model(checkpoint["config"]["model"], src_vocab_size=size, tgt_vocab_size=size)
    checkpoint["model"] = model.state_dict()
    checkpoint["tokenizers"] = tokenizers_to_payload(Tokenizers(src=tokenizer, tgt=tokenizer,
                                                                joint=True))
    path = directory / "other.pt"
    save_checkpoint(checkpoint, path)
    return path


def test_mismatched_vocabularies_are_refused(tmp_path, trained_checkpoint, run_python):
    other = other_vocabulary_checkpoint(trained_checkpoint, tmp_path)
    with pytest.raises(ValueError, match=r"cannot ensemble .*best\.pt and .*other\.pt: their "
                                         r"source vocabularies differ \(39 vs \d+ pieces; first "
                                         r"difference at id 4: '▁fish' vs"):
        load_translator([trained_checkpoint, other])
    same = load_translator(trained_checkpoint).tokenizers
    check_same_vocabularies([same, same], ["a", "b"])  # no error

    result = run_python(
        [ROOT / "translate.py", f"checkpoint=[{trained_checkpoint},{other}]", "text=red cat"],
        env=ENV, cwd=tmp_path, timeout=120,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: cannot ensemble") and "Traceback" not in result.stderr


def test_evaluate_and_translate_take_a_list_of_checkpoints(tmp_path, weak_members, run_python):
    shutil.copytree(weak_members[0].parents[1] / "corpus", tmp_path / "corpus")
    members = ",".join(str(p) for p in weak_members)
    result = run_python(
        [ROOT / "evaluate.py", f"checkpoint=[{members}]", "beam_size=2",
         f"output_dir={tmp_path / 'eval'}"],
        env=ENV, cwd=tmp_path, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    (summary_path,) = (tmp_path / "eval").glob("ensemble2-*.test.beam2.json")
    summary = json.loads(summary_path.read_text())
    assert summary["checkpoints"] == [str(p) for p in weak_members]
    hypotheses = Path(summary["hypotheses"]).read_text(encoding="utf-8").splitlines()
    ensemble = load_translator(weak_members)
    sources = (tmp_path / "corpus" / "test.src").read_text(encoding="utf-8").splitlines()
    expected = [n_best[0].text for n_best in ensemble.translate(
        sources, DecodeOptions(beam_size=2), return_attention=False)]
    assert hypotheses == expected
    assert f"BLEU = {summary['bleu']:.2f}" in result.stdout


def test_server_loads_an_ensemble(weak_members):
    from omegaconf import OmegaConf

    from seq2seq.cli.serve import model_paths
    from seq2seq.serving.models import load_model

    paths = [str(p) for p in weak_members]
    cfg = OmegaConf.create({"checkpoint": paths, "name": None, "models": None})
    assert model_paths(cfg) == {"ensemble": paths}
    cfg = OmegaConf.create({"checkpoint": None, "models": {"both": paths, "one": paths[0]}})
    assert model_paths(cfg) == {"both": paths, "one": paths[0]}

    served = load_model(paths, options=DecodeOptions(beam_size=2))
    assert served.options.beam_size == 2
    assert isinstance(served.translator.model, Ensemble)
    assert served.scorer == "AdditiveScorer+DotScorer"
    assert served.parameters == sum(
        t.numel() for p in paths for t in load_checkpoint(p)["model"].values()
    )
    assert served.training is None
