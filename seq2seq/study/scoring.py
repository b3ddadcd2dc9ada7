"""Score one run's ``best.pt`` on a split, through the evaluation path ``evaluate.py`` uses.

What is scored, and the cache in ``RUN/compare/``: docs/compare.md, "What `compare.py` does". A
cached result is reused while the checkpoint file (size and modification time) and the settings
of :func:`settings_key` are unchanged.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from seq2seq.atomic import write_text
from seq2seq.device import decide_precision, select_device
from seq2seq.inference.decode_options import DecodeOptions
from seq2seq.inference.evaluation import AttentionStatistics
from seq2seq.study.positions import position_counts

log = logging.getLogger("seq2seq.compare")
CACHE_VERSION = 3  # 2: the attention's backward moves and coverage; 3: positions, probes


# The decoding options compare.py sets (the others keep DecodeOptions' defaults); a score's
# settings, cached and recorded, name these beside ScoringOptions' own.
SCORED_OPTIONS = ("beam_size", "length_penalty", "max_len_a", "max_len_b")
# The attention statistics of an evaluation, in the order the scores, the report's table and
# its CSV and JSON give them.
ATTENTION_STATS = tuple(f"attention_{name}" for name in AttentionStatistics._fields)


@dataclass(frozen=True)
class ScoringOptions:
    """How to decode (as in ``evaluate.py``), the split, and the sentence whose attention is
    kept."""

    split: str = "test"
    decoding: DecodeOptions = DecodeOptions()
    max_source_length: int = 250
    max_tokens: int = 4000
    precision: str = "fp32"
    device: str = "auto"
    heatmap_sentence: int = 0
    probes: bool = True  # decode again with uniform and with shifted attention weights

    def translator_options(self) -> dict[str, Any]:
        return {
            "max_tokens": self.max_tokens,
            "max_source_length": self.max_source_length,
            "precision": self.precision,
        }


def cache_paths(run_dir: Path, options: ScoringOptions) -> tuple[Path, Path]:
    stem = f"best.{options.split}.beam{options.decoding.beam_size}"
    folder = Path(run_dir) / "compare"
    return folder / f"{stem}.hyp", folder / f"{stem}.json"


def settings_key(options: ScoringOptions) -> dict[str, Any]:
    """The settings the scores depend on, as the cache (and a run record) keeps them."""
    decoding = options.decoding
    # compare.py's options always; another option only where a caller changed it, so that
    # the keys already written (the flat ones of SCORED_OPTIONS) stay what they were.
    settings = {option.name: getattr(decoding, option.name) for option in fields(decoding)
                if option.name in SCORED_OPTIONS
                or getattr(decoding, option.name) != option.default}
    settings |= {option.name: getattr(options, option.name) for option in fields(options)
                 if option.name not in ("decoding", "device")}  # scores do not depend on device
    with contextlib.suppress(ValueError):  # a bad value is reported by the scoring itself
        # The scores do depend on the precision auto chooses on that device (here its
        # products-only measurement: no model is loaded yet).
        settings["precision"] = decide_precision(options.precision,
                                                 select_device(options.device))[0]
    return {"version": CACHE_VERSION, "settings": settings}


def _cache_key(checkpoint: Path, options: ScoringOptions) -> dict[str, Any]:
    stat = checkpoint.stat()
    return {**settings_key(options), "checkpoint_size": stat.st_size,
            "checkpoint_mtime_ns": stat.st_mtime_ns}


def sha256_lines(lines: list[str]) -> str:
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode("utf-8") + b"\n")
    return digest.hexdigest()


def load_cached(run_dir: Path, checkpoint: Path, options: ScoringOptions) -> dict | None:
    """The cached result of a run, or None when absent, unreadable or stale."""
    _, json_path = cache_paths(run_dir, options)
    try:
        cached = json.loads(json_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(cached, dict) or cached.get("key") != _cache_key(checkpoint, options):
        return None
    return cached


def score_run(
    run_dir: str | Path, checkpoint: str | Path, options: ScoringOptions, *, refresh: bool = False
) -> dict[str, Any]:
    """Translate the split with ``checkpoint``; return (and cache) the result written below,
    with ``cached`` telling whether it came from the cache. ``faithfulness``: the BLEU and chrF
    of :mod:`seq2seq.study.faithfulness`'s probes, or None when ``options.probes`` is off or the
    model has no attention to replace; ``heatmap``: one sentence's weights, or None.

    Raises:
        CheckpointError, DataError, ValueError: on unreadable checkpoints or data.
    """
    run_dir, checkpoint = Path(run_dir), Path(checkpoint)
    if not refresh:
        cached = load_cached(run_dir, checkpoint, options)
        if cached is not None:
            cached["cached"] = True
            return cached

    from seq2seq.inference.evaluation import evaluate_translations, read_parallel, split_files
    from seq2seq.inference.runtimes import open_model

    opened = open_model(checkpoint, options.device, **options.translator_options())
    translator = opened.translator
    src_path, ref_path = split_files(opened.config, options.split)
    sources, references = read_parallel(src_path, ref_path)
    hyp_path, json_path = cache_paths(run_dir, options)
    log.info("scoring %s on %s (%d sentences)", checkpoint, options.split, len(sources))
    evaluation = evaluate_translations(
        translator, sources, references, options.decoding, hypotheses_path=hyp_path,
        attention_stats=True
    )
    heatmap = None
    if 0 <= options.heatmap_sentence < len(sources):
        best = translator.translate([sources[options.heatmap_sentence]],
                                    options.decoding)[0][0]
        if best.attention is not None:
            heatmap = {
                "sentence": options.heatmap_sentence,
                "source_pieces": list(best.source_pieces) + ["</s>"],
                "target_pieces": list(best.target_pieces) + ["</s>"],
                "weights": best.attention.detach().float().cpu().tolist(),
            }
    counts = position_counts(translator.model, translator.tokenizers, sources, references,
                             device=translator.device, autocast_dtype=translator.autocast_dtype,
                             max_source_length=options.max_source_length)
    faithfulness = _probe_scores(translator, sources, references, options) \
        if options.probes else None
    result = {
        "key": _cache_key(checkpoint, options),
        "run": str(run_dir),
        "checkpoint": str(checkpoint),
        "split": options.split,
        "src": str(src_path),
        "ref": str(ref_path),
        "ref_sha256": sha256_lines(references),
        "sentences": len(sources),
        **{key: evaluation.scores[key]
           for key in ("bleu", "chrf", "bleu_signature", "chrf_signature")},
        "generation_seconds": evaluation.generation_seconds,
        "sentences_per_second": evaluation.sentences_per_second,
        "device": str(translator.device),
        **dict(zip(ATTENTION_STATS, evaluation.attention, strict=True)),
        "parameters": translator.parameter_count,  # a tied embedding counted once
        "position_counts": counts.tolist(),
        "faithfulness": faithfulness,
        "hypotheses": evaluation.hypotheses,
        "heatmap": heatmap,
    }
    write_text(json_path, json.dumps(result, indent=1) + "\n")
    result["cached"] = False
    return result


def _probe_scores(translator, sources: list[str], references: list[str],
                  options: ScoringOptions) -> dict[str, dict[str, float]] | None:
    """BLEU and chrF of the split decoded with each probe's weights (same search settings)."""
    from seq2seq.inference.evaluation import evaluate_translations
    from seq2seq.inference.translator import Translator
    from seq2seq.study.faithfulness import PROBES, has_attention, probed_model

    if not has_attention(translator.model):
        return None
    results = {}
    for probe in PROBES:
        log.info("decoding %s with %s attention weights", options.split, probe)
        probed = Translator(probed_model(translator.model, probe), translator.tokenizers,
                            device=translator.device, **options.translator_options())
        scores = evaluate_translations(probed, sources, references,
                                       options.decoding).scores
        results[probe] = {"bleu": scores["bleu"], "chrf": scores["chrf"]}
    return results
