"""``python evaluate.py checkpoint=PATH [overrides]`` / ``seq2seq-evaluate``: score checkpoints.

Translates a test set with beam search and prints sacreBLEU's BLEU and chrF (default
settings, detokenized hypotheses against the raw reference lines) with their signatures, so
the numbers equal what ``sacrebleu REF -i HYP`` prints for the written hypotheses.

The test set is a split (``split=valid|test``, default test) of the data config stored in
the checkpoint (:func:`~seq2seq.data.sources.corpus_files_from_config`), or ``src=FILE
ref=FILE``. ``checkpoint=`` is a file, a run folder, a glob or a list (one ensemble); the
outputs, ``search=sample``, constraints, prefixes and terms: docs/evaluate-translate.md.

Timings: *startup* is loading the checkpoint, building the model and reading the data (for
the first checkpoint also Hydra's config composition and importing torch); *generation* is
the translation alone (tokenize, search, detokenize); *total* is startup, generation, scoring
and writing the files.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from seq2seq.atomic import write_text
from seq2seq.cli.app import hydra_tool
from seq2seq.cli.common import checkpoint_paths, fail
from seq2seq.cli.decoding_request import DecodingRequest, check_config, start_decoding
from seq2seq.inference.export_format import is_exported

log = logging.getLogger("seq2seq.evaluate")
# The first checkpoint's startup time counts from here: Hydra's config composition and the
# torch import come after this point.
MODULE_LOADED = time.perf_counter()


def find_checkpoints(spec: str) -> list[Path]:
    """Checkpoint files named by a file, a run folder or a glob, sorted, without duplicates;
    an exported folder (``seq2seq-export``) stands for itself.

    Raises:
        FileNotFoundError: when nothing matches (its message says what was looked for).
    """
    path = Path(spec).expanduser()
    if path.is_file() or is_exported(path):
        return [path]
    if path.is_dir():
        folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
        found = sorted(p for p in folder.glob("*.pt") if p.is_file())
        if not found:
            raise FileNotFoundError(f"no *.pt checkpoint in {folder}")
        return found
    if glob.has_magic(spec):
        found = sorted(Path(p) for p in glob.glob(str(path)) if Path(p).is_file())
        if not found:
            raise FileNotFoundError(f"no checkpoint file matches {spec}")
        unique = {p.resolve(): p for p in found}  # a glob may reach one file twice via links
        return sorted(unique.values())
    raise FileNotFoundError(f"checkpoint not found: {spec}")


def default_output_dir(checkpoint: Path) -> Path:
    """``RUN/eval`` for ``RUN/checkpoints/x.pt``; ``<folder>/eval`` for any other file."""
    folder = checkpoint.resolve().parent
    return folder.parent / "eval" if folder.name == "checkpoints" else folder / "eval"


def _ensemble_stem(paths: list[Path]) -> str:
    """A file stem naming an ensemble: unique to its members, stable across calls."""
    joined = "\n".join(str(p.resolve()) for p in paths)
    return f"ensemble{len(paths)}-{hashlib.sha256(joined.encode()).hexdigest()[:8]}"


def evaluate_checkpoint(
    path: Path | list[Path], cfg: DictConfig, request: DecodingRequest, *,
    started: float | None = None
) -> dict[str, Any]:
    """Translate and score one checkpoint (a list: one ensemble); write its hypotheses and
    summary; return the summary. ``started``: the ``time.perf_counter()`` the startup time
    counts from (default: now)."""
    started = time.perf_counter() if started is None else started
    from seq2seq.inference.evaluation import evaluate_translations, read_parallel, split_files

    members = path if isinstance(path, list) else [path]
    options = request.options
    opened = request.open(members, cfg.device)
    translator = opened.translator
    if cfg.src is not None:
        src_path, ref_path = Path(cfg.src), Path(cfg.ref)
        test_name = src_path.name
    else:
        overrides = OmegaConf.to_container(cfg.data, resolve=True) if cfg.data else None
        src_path, ref_path = split_files(opened.config, cfg.split, overrides)
        test_name = cfg.split
    sources, references = read_parallel(src_path, ref_path)
    guidance = request.guidance(translator, input_lines=len(sources))
    steering = guidance.for_lines(sources)
    startup = time.perf_counter() - started

    output_dir = Path(cfg.output_dir) if cfg.output_dir else default_output_dir(members[0])
    name = members[0].stem if len(members) == 1 else _ensemble_stem(members)
    search = options.label.replace(" ", "")  # beam5, sample
    # Steered translations never overwrite the plain ones they are compared with.
    stem = f"{name}.{test_name}.{search}{'.constrained' if guidance.active else ''}"
    hyp_path, json_path = output_dir / f"{stem}.hyp", output_dir / f"{stem}.json"
    evaluation = evaluate_translations(translator, sources, references, options,
                                       hypotheses_path=hyp_path, **steering)
    scores = evaluation.scores
    summary = {
        "checkpoint": " + ".join(str(m) for m in members),
        "checkpoints": [str(m) for m in members],
        "split": None if cfg.src is not None else cfg.split,
        "src": str(src_path),
        "ref": str(ref_path),
        "sentences": len(sources),
        **{key: scores[key] for key in ("bleu", "bleu_detail", "bleu_signature", "chrf",
                                        "chrf_signature")},
        **{key: value for key, value in asdict(options).items() if key != "nbest"},
        "search_label": options.label,
        "max_tokens": cfg.batch.max_tokens,
        "device": str(translator.device),
        "quantize": translator.quantize,
        "shortlist": str(cfg.shortlist) if cfg.get("shortlist") else None,
        **{key: str(cfg[key]) if cfg[key] else None for key in ("constraints", "prefix", "terms")},
        "terms_ignore_case": cfg.terms_ignore_case,
        "required_phrases": evaluation.required_phrases,
        "term_use_rate": evaluation.term_use_rate,
        "startup_seconds": startup,
        "generation_seconds": evaluation.generation_seconds,
        "sentences_per_second": evaluation.sentences_per_second,
        "hypotheses": str(hyp_path),
    }
    summary["total_seconds"] = time.perf_counter() - started
    write_text(json_path, json.dumps(summary, indent=2) + "\n")
    summary["summary"] = str(json_path)
    return summary


def print_summary(summary: Mapping[str, Any]) -> None:
    print(f"checkpoint: {summary['checkpoint']}")
    test_set = summary["split"] or summary["src"]
    print(f"test set:   {test_set} ({summary['sentences']} sentences), "
          f"{summary['search_label']}")
    print(summary["bleu_detail"])
    print(f"BLEU signature: {summary['bleu_signature']}")
    print(f"chrF2 = {summary['chrf']:.2f}")
    print(f"chrF signature: {summary['chrf_signature']}")
    if summary.get("constraints") or summary.get("terms"):
        rate, required = summary["term_use_rate"], summary["required_phrases"]
        print(f"term use:   {rate:.1%} of {required} required phrases" if rate is not None
              else "term use:   no sentence of the test set asks for a phrase")
    print(
        f"time: startup {summary['startup_seconds']:.1f}s, generation "
        f"{summary['generation_seconds']:.1f}s ({summary['sentences_per_second']:.1f} "
        f"sentences/s), total {summary['total_seconds']:.1f}s"
    )
    print(f"hypotheses: {summary['hypotheses']}")
    print(f"summary:    {summary['summary']}", flush=True)


def format_table(summaries: list[Mapping[str, Any]]) -> str:
    """One row per checkpoint, best BLEU first."""
    rows = sorted(summaries, key=lambda s: -s["bleu"])
    lines = [f"{'BLEU':>7} {'chrF':>7} {'sent/s':>8}  checkpoint"]
    lines += [
        f"{s['bleu']:7.2f} {s['chrf']:7.2f} {s['sentences_per_second']:8.1f}  {s['checkpoint']}"
        for s in rows
    ]
    return "\n".join(lines)


def run(cfg: DictConfig) -> list[dict[str, Any]]:
    """Score every checkpoint named by ``cfg.checkpoint``; returns their summaries."""
    check_config(cfg)
    if OmegaConf.is_missing(cfg, "checkpoint") or not cfg.checkpoint:
        fail("no checkpoint given: add checkpoint=PATH (a file, a run folder or a glob)")
    if (cfg.src is None) != (cfg.ref is None):
        fail("give both src=FILE and ref=FILE, or neither (to score a split)")
    if cfg.nbest != 1:
        fail(f"nbest={cfg.nbest}: evaluate.py scores each sentence's best translation; "
             "translate.py nbest=N writes the N best")
    try:
        if OmegaConf.is_list(cfg.checkpoint):
            # One ensemble of every checkpoint the entries name.
            members = [p for spec in checkpoint_paths(cfg.checkpoint) for p in find_checkpoints(spec)]
            paths: list[Path | list[Path]] = [members]
        else:
            paths = list(find_checkpoints(str(cfg.checkpoint)))
    except FileNotFoundError as error:
        fail(error)
    # torch loads from here on: a bad option or a mistyped path above is refused without it.
    from seq2seq.checkpoint import CheckpointError
    from seq2seq.data.text_files import DataError

    request = start_decoding(cfg)
    summaries = []
    try:
        for number, path in enumerate(paths):
            summary = evaluate_checkpoint(path, cfg, request,
                                          started=MODULE_LOADED if number == 0 else None)
            print_summary(summary)
            if len(paths) > 1:
                print(flush=True)
            summaries.append(summary)
    except (CheckpointError, DataError, ValueError) as error:
        fail(error)
    if len(summaries) > 1:
        print(format_table(summaries), flush=True)
    return summaries


def best_bleu(cfg: DictConfig) -> float:
    """The best BLEU of :func:`run` (what a Hydra sweeper optimises)."""
    return max(summary["bleu"] for summary in run(cfg))


# ``python evaluate.py``: see the module docstring (``--help`` lists the options).
main = hydra_tool(best_bleu, config_name="evaluate", summary=__doc__.splitlines()[0])


if __name__ == "__main__":
    main()
