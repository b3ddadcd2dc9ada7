"""scripts/ab_training.py: the alternating A/B of two ways to compute a training step."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "ab_training.py"


@pytest.fixture(scope="module")
def script():
    """The script as a module, loaded once; the ``sys.path`` entries it adds are removed after."""
    path_before = list(sys.path)
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        spec = importlib.util.spec_from_file_location("ab_training", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path_before
    return module


def test_each_side_installs_its_own_implementation_and_the_code_is_put_back(script):
    import seq2seq.models.decoders as decoders
    import seq2seq.models.dropout as dropout_module
    import seq2seq.models.encoder as encoder_module
    import seq2seq.models.scorers as scorers

    original = (dropout_module.dropout, encoder_module.functional_dropout,
                scorers.AdditiveScorer.score, decoders.AttentionDecoder._embed)
    try:
        (_, torch_side), (_, ours) = script.COMPARISONS["dropout"]
        torch_side()
        assert dropout_module.dropout is script._torch_dropout
        assert encoder_module.functional_dropout is script._torch_dropout
        ours()
        assert dropout_module.dropout is original[0] is encoder_module.functional_dropout
        (_, at_once), (_, chunks) = script.COMPARISONS["additive"]
        at_once()
        assert scorers.AdditiveScorer.score is script._additive_at_once
        chunks()
        assert scorers.AdditiveScorer.score is script._additive_chunks
        (_, per_step), (_, once) = script.COMPARISONS["embedded"]
        per_step()
        assert decoders.AttentionDecoder._embed is script._embed_float32
        once()
        assert decoders.AttentionDecoder._embed is original[3]
        # What the comparisons that follow another one run on: the code as it is.
        torch_side(), at_once(), per_step()
        script.restore_the_code()
        assert (dropout_module.dropout, encoder_module.functional_dropout,
                scorers.AdditiveScorer.score, decoders.AttentionDecoder._embed) == original
    finally:
        dropout_module.dropout, encoder_module.functional_dropout = original[:2]
        scorers.AdditiveScorer.score = original[2]
        decoders.AttentionDecoder._embed = original[3]


def test_runs_both_sides_of_each_comparison_in_one_process(run_python):
    """bf16: the two sides of ``embedded`` differ under autocast only."""
    command = [SCRIPT, "dropout,additive,embedded",
               "experiment=multi30k_gru_additive", "model.embed_dim=16",
               "model.encoder.hidden_size=8", "model.decoder.hidden_size=16", "batch.max_tokens=60",
               "trainer.precision=bf16", "--batches", "1", "--rounds", "2"]
    result = run_python(command, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 9
    for first, (comparison, names) in zip(range(0, 9, 3), [
            ("dropout", ["torch", "int16 mask"]), ("additive", ["at once", "chunks"]),
            ("embedded", ["per step", "once"])], strict=True):
        assert lines[first].startswith(f"{comparison}: experiment=multi30k_gru_additive")
        assert lines[first + 1].strip().startswith(names[0])
        assert lines[first + 2].strip().startswith(names[1])


def test_refuses_the_additive_comparison_without_an_additive_scorer(run_python):
    refused = run_python([SCRIPT, "additive", "experiment=multi30k_luong_fast", "model.embed_dim=8",
                          "model.encoder.hidden_size=4", "model.decoder.hidden_size=8",
                          "--batches", "1", "--rounds", "1"], timeout=60)
    assert refused.returncode == 2
    assert "needs a model with the additive scorer" in refused.stderr.splitlines()[-1]


def test_refuses_counts_below_one_and_unknown_comparisons(script, run_python):
    refused = run_python([SCRIPT, "dropout", "--batches", "1", "--rounds", "0"], timeout=60)
    assert refused.returncode == 2 and "must be positive" in refused.stderr
    assert script._comparison_names("dropout,embedded") == ["dropout", "embedded"]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown comparison 'colour'"):
        script._comparison_names("dropout,colour")
