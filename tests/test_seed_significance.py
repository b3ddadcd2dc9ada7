"""Significance over seeds: the ASO wiring against deepsig's own results on score sets whose
answer is known (a clear winner, a tie), and what the report says without a test."""

from __future__ import annotations

import numpy as np
import pytest

from seq2seq.study.seed_significance import (
    CONFIDENCE,
    TAU,
    aso_between_groups,
    corrected_confidence,
    markdown_section,
    separation_chance,
)

deepsig = pytest.importorskip("deepsig")
ITERATIONS = 100  # deepsig's default is 1000: the answers here are clear at 100


def scores(mean: float, seed: int, count: int = 5) -> list[float]:
    return list(np.random.default_rng(seed).normal(mean, 0.3, count))


def test_a_clear_winner_beats_the_others_and_matches_deepsig():
    groups = {"strong": scores(32.0, 1), "weak": scores(28.0, 2), "weaker": scores(25.0, 3)}
    result = aso_between_groups(groups, iterations=ITERATIONS, seed=7)
    expected = deepsig.multi_aso(groups, confidence_level=1 - 0.05 / 3, use_bonferroni=False,
                                 num_bootstrap_iterations=ITERATIONS, seed=7,
                                 show_progress=False)
    np.testing.assert_allclose(result.eps_min, expected)
    assert {(a, b) for a, b, _ in result.wins} == {
        ("strong", "weak"), ("strong", "weaker"), ("weak", "weaker")}
    assert result.eps("strong", "weak") < TAU <= result.eps("weak", "strong")
    assert result.confidence == pytest.approx(1 - 0.05 / 3)
    assert result.few_seeds == [] and result.provisional == [] and result.note is None
    text = "\n".join(markdown_section(result))
    assert "strong beats weak" in text and "0.9833" in text


def test_groups_from_one_distribution_tie():
    groups = {"a": scores(30.0, 4, 8), "b": scores(30.0, 5, 8)}
    result = aso_between_groups(groups, iterations=ITERATIONS, seed=7)
    assert result.wins == []
    assert result.eps("a", "b") >= TAU and result.eps("b", "a") >= TAU
    assert "No difference survives" in "\n".join(markdown_section(result))


def test_a_group_with_one_seed_is_not_tested_and_the_report_says_why():
    result = aso_between_groups({"a": [30.0], "b": scores(28.0, 6, 3)}, iterations=ITERATIONS)
    assert result.labels == [] and result.left_out == ["a"]
    assert "at least 2 runs (seeds)" in result.note
    assert "Not computed: needs two groups with at least 2 runs" in "\n".join(
        markdown_section(result))
    three = aso_between_groups({"a": [30.0], "b": scores(28.0, 6, 3), "c": scores(31.0, 8, 3)},
                               iterations=ITERATIONS)
    assert three.labels == ["b", "c"] and three.left_out == ["a"]
    assert three.few_seeds == ["b", "c"]
    text = "\n".join(markdown_section(three))
    assert "Not tested (fewer than 2 runs): a" in text and "Fewer than 5 seeds" in text


def test_a_win_from_too_few_runs_for_the_level_is_marked_provisional():
    # Both runs of "a" above both of "b": eps_min is 0, but identical groups do that 1 time in 6.
    result = aso_between_groups({"a": [38.0, 38.4], "b": [37.0, 37.3]}, iterations=ITERATIONS)
    assert [(a, b) for a, b, _ in result.wins] == [("a", "b")]
    assert result.provisional == [("a", "b")] and result.runs == {"a": 2, "b": 2}
    text = "\n".join(markdown_section(result))
    assert "a beats b (eps_min 0.000), provisional: with 2 and 2 runs" in text
    assert "1 time in 6, more often than the 0.0500" in text
    assert separation_chance(2, 2) == pytest.approx(1 / 6)
    # With 8 groups (28 pairs), 5 runs each are not enough for the corrected level; 6 are.
    assert separation_chance(5, 5) > 0.05 / 28 > separation_chance(6, 6)


def test_the_correction_is_bonferroni_over_the_pairs():
    assert corrected_confidence(2) == pytest.approx(CONFIDENCE)
    assert corrected_confidence(8) == pytest.approx(1 - 0.05 / 28)


def test_an_existing_report_is_tested_again_from_its_json(tmp_path, capsys):
    import json

    from seq2seq.study.seed_significance import main

    report = {"groups": [
        {"group": "strong", "per_run": [{"bleu": b} for b in scores(32.0, 1)]},
        {"group": "weak", "per_run": [{"bleu": b} for b in scores(28.0, 2)]},
        {"group": "none scored", "per_run": []},
    ]}
    (tmp_path / "comparison.json").write_text(json.dumps(report))
    assert main([str(tmp_path / "comparison.json"), "--iterations", str(ITERATIONS)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("## Significance over seeds") and "strong beats weak" in out


def test_the_command_refuses_a_bad_report_in_one_line(tmp_path, capsys):
    from seq2seq.study.seed_significance import main

    assert main([str(tmp_path / "missing.json")]) == 1
    assert capsys.readouterr().err.startswith("error: cannot read")
