"""Corpus BLEU and chrF with sacreBLEU's default settings, on detokenized text.

Every score the framework reports goes through here, so validation, ``evaluate.py`` and the
``sacrebleu`` command agree on the same hypotheses and references.
"""

from __future__ import annotations

from collections.abc import Sequence

from sacrebleu.metrics import BLEU, CHRF


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """BLEU and chrF of ``hypotheses`` against one reference each, with signatures, and
    ``length_ratio``: sacreBLEU's hypothesis-to-reference length ratio (below 1 the brevity
    penalty lowers BLEU: the output is short)."""
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: they must match"
        )
    bleu, chrf = BLEU(), CHRF()
    bleu_score = bleu.corpus_score(list(hypotheses), [list(references)])
    chrf_score = chrf.corpus_score(list(hypotheses), [list(references)])
    return {
        "bleu": bleu_score.score,
        "chrf": chrf_score.score,
        "length_ratio": bleu_score.ratio,
        "bleu_detail": str(bleu_score),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }


def corpus_scores_with_intervals(hypotheses: Sequence[str], references: Sequence[str], *,
                                 resamples: int = 1000) -> dict:
    """BLEU and chrF with sacreBLEU's 95% bootstrap confidence intervals (``resamples``
    resamplings of the sentences; sacreBLEU's fixed seed, so the same inputs give the same
    intervals): ``bleu``, ``bleu_ci``, ``chrf``, ``chrf_ci``, the intervals as half-widths."""
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: they must match"
        )
    result = {}
    for name, metric in (("bleu", BLEU()), ("chrf", CHRF())):
        score = metric.corpus_score(list(hypotheses), [list(references)], n_bootstrap=resamples)
        result[name], result[f"{name}_ci"] = score.score, float(score._ci)
    return result
