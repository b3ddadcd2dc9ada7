"""Corpus BLEU and chrF with sacreBLEU's default settings, on detokenized text.

Every score the framework reports goes through here, so validation, ``evaluate.py`` and the
``sacrebleu`` command agree on the same hypotheses and references.
"""

from __future__ import annotations

from collections.abc import Sequence

from sacrebleu.metrics import BLEU, CHRF


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """BLEU and chrF of ``hypotheses`` against one reference each, with signatures."""
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
        "bleu_detail": str(bleu_score),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }
