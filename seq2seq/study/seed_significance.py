"""Significance over seeds: Almost Stochastic Order between every pair of groups.

See docs/compare.md, "Significance over seeds": the decision rule, the correction for multiple
comparisons, how many seeds and the provisional wins. ASO is deepsig's ``multi_aso`` (del Barrio
et al. 2018, Dror et al. 2019), with its own ``use_bonferroni`` turned off: that raises the level
to ``0.95 + 0.05 / m``, which is weaker than Bonferroni's for more than two pairs, and 1.0 for
two groups.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from seq2seq.study import markdown

TAU = 0.2
CONFIDENCE = 0.95
MIN_SEEDS = 2
RECOMMENDED_SEEDS = 5
DEFAULT_ITERATIONS = 1000


@dataclass
class SeedSignificance:
    """The ASO comparison of the groups.

    Attributes:
        labels: the groups tested, in the order of ``eps_min``'s rows and columns.
        eps_min: ``eps_min[i][j]``, the violation bound of "group i beats group j".
        confidence: the confidence level after the Bonferroni correction.
        wins: ``(a, b, eps_min)`` for every ordered pair where a beats b.
        note: why no test was run (deepsig missing, fewer than two groups with enough runs).
        left_out: the groups with fewer than :data:`MIN_SEEDS` runs.
        few_seeds: the groups tested with fewer than :data:`RECOMMENDED_SEEDS` runs.
        runs: each tested group's number of runs.
        provisional: the ``(a, b)`` of the wins with too few runs for the confidence
            (:func:`separation_chance` above ``1 - confidence``).
    """

    labels: list[str] = field(default_factory=list)
    eps_min: list[list[float]] = field(default_factory=list)
    confidence: float | None = None
    wins: list[tuple[str, str, float]] = field(default_factory=list)
    note: str | None = None
    left_out: list[str] = field(default_factory=list)
    few_seeds: list[str] = field(default_factory=list)
    runs: dict[str, int] = field(default_factory=dict)
    provisional: list[tuple[str, str]] = field(default_factory=list)

    def eps(self, a: str, b: str) -> float | None:
        """``eps_min`` of "a beats b", or None when either was not tested."""
        if a not in self.labels or b not in self.labels:
            return None
        return self.eps_min[self.labels.index(a)][self.labels.index(b)]


def corrected_confidence(groups: int, confidence: float = CONFIDENCE) -> float:
    """Bonferroni's corrected confidence level for all pairs of ``groups`` groups."""
    comparisons = max(groups * (groups - 1) // 2, 1)
    return 1 - (1 - confidence) / comparisons


def separation_chance(runs_a: int, runs_b: int) -> float:
    """The chance that two groups with the same score distribution, of ``runs_a`` and ``runs_b``
    runs, put every run of the first above every run of the second: ``1 / C(a + b, a)``."""
    return 1 / math.comb(runs_a + runs_b, runs_a)


def aso_between_groups(scores: Mapping[str, Sequence[float]], *,
                       iterations: int = DEFAULT_ITERATIONS, seed: int = 0) -> SeedSignificance:
    """ASO between every pair of groups of ``scores`` (group -> one score per run, e.g. BLEU per
    seed), with deepsig's ``iterations`` bootstrap iterations per pair (its default; each pair
    takes seconds) and its random ``seed``, so that a report is reproducible."""
    tested = {label: [float(s) for s in values] for label, values in scores.items()
              if len(values) >= MIN_SEEDS}
    result = SeedSignificance(left_out=[label for label in scores if label not in tested])
    if len(tested) < 2:
        result.note = (f"needs two groups with at least {MIN_SEEDS} runs (seeds) each; "
                       f"{len(tested)} group(s) have them")
        return result
    try:
        import deepsig
    except ImportError:
        result.note = "needs the deepsig package: pip install '.[study]'"
        return result
    result.confidence = corrected_confidence(len(tested))
    with warnings.catch_warnings():
        # Two groups with the very same scores: their violation ratio is 0 / 0.
        warnings.filterwarnings("ignore", message="Division by zero encountered")
        matrix = deepsig.multi_aso(tested, confidence_level=result.confidence,
                                   use_bonferroni=False, num_bootstrap_iterations=iterations,
                                   seed=seed, show_progress=False, return_df=False)
    result.labels = list(tested)
    result.eps_min = [[float(value) for value in row] for row in matrix]
    result.wins = [(a, b, result.eps_min[i][j])
                   for i, a in enumerate(result.labels) for j, b in enumerate(result.labels)
                   if i != j and result.eps_min[i][j] < TAU]
    result.few_seeds = [label for label, values in tested.items()
                        if len(values) < RECOMMENDED_SEEDS]
    result.runs = {label: len(values) for label, values in tested.items()}
    result.provisional = [(a, b) for a, b, _ in result.wins
                          if separation_chance(result.runs[a], result.runs[b])
                          > 1 - result.confidence]
    return result


def _win_line(result: SeedSignificance, a: str, b: str, eps: float) -> str:
    line = f"- {a} beats {b} (eps_min {eps:.3f})"
    if (a, b) not in result.provisional:
        return line
    n, m = result.runs[a], result.runs[b]
    odds = round(1 / separation_chance(n, m))
    return (f"{line}, provisional: with {n} and {m} runs, identical groups rank every run of "
            f"the first above every run of the second 1 time in {odds}, more often than the "
            f"{1 - result.confidence:.4f} the level allows")


def markdown_section(result: SeedSignificance) -> list[str]:
    """The report's section on significance over seeds, as markdown lines."""
    lines = ["## Significance over seeds (Almost Stochastic Order)", ""]
    if result.note:
        lines += [f"Not computed: {result.note}.", ""]
        return lines
    lines += [
        f"The unit is the training run: each group's test BLEU per seed. Rule: a group beats "
        f"another when ASO's eps_min < {TAU} (deepsig, Dror et al. 2019), at confidence "
        f"{result.confidence:.4f} (0.95 with Bonferroni's correction over the "
        f"{len(result.labels) * (len(result.labels) - 1) // 2} pairs). Row beats column:", "",
        *markdown.table(["eps_min", *result.labels], (
            [label] + ["-" if other == label else f"{value:.3f}"
                       for other, value in zip(result.labels, row, strict=True)]
            for label, row in zip(result.labels, result.eps_min, strict=True))),
        "",
    ]
    if result.wins:
        lines += ["Differences that survive:", ""]
        lines += [_win_line(result, a, b, eps) for a, b, eps in result.wins]
    else:
        lines.append("No difference survives: no group beats another at this threshold.")
    lines.append("")
    if result.left_out:
        lines += [f"Not tested (fewer than {MIN_SEEDS} runs): {', '.join(result.left_out)}.",
                  ""]
    if result.few_seeds:
        lines += [f"Fewer than {RECOMMENDED_SEEDS} seeds, the smallest sample ASO's error rates "
                  f"were measured with: {', '.join(result.few_seeds)}.", ""]
    return lines


def scores_from_report(path: str) -> dict[str, list[float]]:
    """Each group's per-run BLEU from a ``comparison.json`` that ``compare.py`` wrote."""
    import json
    from pathlib import Path

    document = json.loads(Path(path).read_text(encoding="utf-8"))
    return {group["group"]: [run["bleu"] for run in group["per_run"]]
            for group in document["groups"] if group["per_run"]}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m seq2seq.study.seed_significance comparison.json [--iterations N]``: the
    significance over seeds of an existing report's groups, as markdown, without scoring again."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("report", help="a comparison.json written by compare.py")
    parser.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS)
    args = parser.parse_args(argv)
    if args.iterations < 1:
        parser.error(f"--iterations must be at least 1, got {args.iterations}")
    try:
        scores = scores_from_report(args.report)
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"error: cannot read {args.report}: {error}", file=sys.stderr)
        return 1
    result = aso_between_groups(scores, iterations=args.iterations)
    print("\n".join(markdown_section(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
