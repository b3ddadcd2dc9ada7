"""Compare runs end to end: discover, group, score (cached), aggregate, test, write, plot."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from seq2seq.atomic import write_text
from seq2seq.config_types import error_reason
from seq2seq.console import count_bar, logs_above_bars
from seq2seq.study import buckets, faithfulness, positions
from seq2seq.study.logs import TrainingLog, read_training_log
from seq2seq.study.records import scored_with, write_record
from seq2seq.study.report import (
    GroupRow,
    csv_text,
    json_text,
    markdown_report,
    markdown_table,
    significance,
    summarize,
)
from seq2seq.study.runs import (
    StudyError,
    discover_runs,
    group_runs,
    left_out_of_labels,
    shared_settings,
)
from seq2seq.study.scoring import ScoringOptions, score_run, settings_key, sha256_lines
from seq2seq.study.seed_significance import (
    DEFAULT_ITERATIONS,
    RECOMMENDED_SEEDS,
    aso_between_groups,
    markdown_section,
)

log = logging.getLogger("seq2seq.compare")


@dataclass
class Comparison:
    """What :func:`compare` found and wrote."""

    rows: list[GroupRow]
    failed: list[dict[str, Any]]
    table: str
    files: list[Path]


def common_parent(paths: Sequence[Path]) -> Path:
    """The deepest folder that holds every path (a single run: the run folder itself)."""
    return Path(os.path.commonpath([str(Path(p).resolve()) for p in paths]))


def compare(
    specs: Sequence[str],
    options: ScoringOptions,
    *,
    output_dir: str | Path | None = None,
    test: str = "bs",
    samples: int = 0,
    refresh: bool = False,
    plots: bool = True,
    aso_iterations: int = DEFAULT_ITERATIONS,
    records_dir: str | Path | None = None,
) -> Comparison:
    """Compare the runs named by ``specs`` (sweep folders, run folders, run records, globs).

    ``records_dir``: also write a record of every scored run folder there
    (:mod:`seq2seq.study.records`).

    Raises:
        StudyError: no runs, bad options.
    """
    if test not in ("bs", "ar", "none"):
        raise StudyError(f"test must be bs, ar or none, got {test!r}")
    runs = discover_runs(specs)
    keys, groups = group_runs(runs)
    scores: dict[str, dict[str, Any]] = {}
    logs: dict[str, TrainingLog] = {}
    wanted = settings_key(options)
    for run in runs:
        if run.ok and run.recorded is not None:
            if scored_with(run.recorded, wanted):
                scores[str(run.path)], logs[str(run.path)] = run.recorded.scores, run.recorded.log
            else:
                run.failure = ("recorded with other scoring settings or an older compare.py: "
                               "score its run folder again")
    to_score = [run for run in runs if run.ok and run.recorded is None]
    with logs_above_bars(), count_bar(len(to_score), description="runs scored", unit=" runs",
                                      leave=True) as runs_bar:
        for number, run in enumerate(to_score, start=1):
            log.info("run %d of %d: %s", number, len(to_score), run.path)
            try:
                scores[str(run.path)] = score_run(run.path, run.checkpoint, options, refresh=refresh)
                logs[str(run.path)] = read_training_log(run.path)
            except Exception as error:  # a damaged run is listed as failed, the others go on
                run.failure = f"scoring failed: {error_reason(error)}"
                log.warning("%s: %s", run.path, run.failure)
                continue
            finally:
                runs_bar.update(1)
            if records_dir is not None:
                write_record(records_dir, run.path, run.config, scores[str(run.path)],
                             logs[str(run.path)])

    rows = [summarize(group, scores, logs) for group in groups]
    scored = sorted((row for row in rows if row.runs), key=lambda row: -row.bleu[0])
    if scored:
        scored[0].best = True
    text = _split_text(scored, scores)
    description = _sentence_test(scored, scores, test, samples, text)
    seed_test = None
    sections: list[str] = []
    if aso_iterations > 0 and scored:
        seed_test = aso_between_groups(
            {row.label: [r["bleu"] for r in row.per_run] for row in scored},
            iterations=aso_iterations)
        best = scored[0].label
        for row in scored:
            row.aso_vs_best = None if row.best else seed_test.eps(best, row.label)
            row.aso_provisional = (best, row.label) in seed_test.provisional
        for label in seed_test.few_seeds + seed_test.left_out:
            log.warning("group %s has fewer than %d seeds: ASO's error rates were measured from "
                        "%d seeds per group up", label, RECOMMENDED_SEEDS, RECOMMENDED_SEEDS)
        sections = markdown_section(seed_test)
    length_rows = [] if text is None else buckets.bucket_scores(_outputs(scored, scores), *text)
    sections += buckets.markdown_section(length_rows)
    position_rows = [] if text is None else positions.position_scores(
        [(row.label, [scores[r["run"]]["position_counts"] for r in row.per_run])
         for row in scored])
    sections += positions.markdown_section(position_rows)
    probe_rows = [faithfulness.group_summary(row.label, row.per_run) for row in scored]
    probe_rows = [r for r in probe_rows if r is not None]
    sections += faithfulness.markdown_section(probe_rows)
    rows = scored + [row for row in rows if not row.runs]

    failed = [{"run": str(run.path), "group": group.label, "reason": run.failure}
              for group in groups for run in group.failed_runs]
    output = Path(output_dir) if output_dir else common_parent([r.path for r in runs])
    meta = {"split": options.split, "beam_size": options.decoding.beam_size, "runs": len(runs),
            "differing_keys": keys, "shared_settings": shared_settings(runs),
            "left_out_of_labels": left_out_of_labels(groups), "significance_test": description,
            "seed_significance": asdict(seed_test) if seed_test else None,
            "length_buckets": length_rows, "positions": position_rows,
            "faithfulness": probe_rows, "options": asdict(options)}
    files = [output / "comparison.md", output / "comparison.csv", output / "comparison.json"]
    plot_files: list[Path] = []
    if plots:
        plot_files = _plots(output, scored, logs, scores, options,
                            {"length": length_rows, "positions": position_rows,
                             "faithfulness": probe_rows})
    write_text(files[0], markdown_report(rows, failed, meta, [p.name for p in plot_files],
                                         sections))
    write_text(files[1], csv_text(rows))
    write_text(files[2], json_text(rows, failed, meta))
    return Comparison(rows=rows, failed=failed, table=markdown_table(rows),
                      files=files + plot_files)


def _outputs(scored: list[GroupRow], scores: dict) -> list[tuple[str, list[list[str]]]]:
    """Each group's label and hypotheses, one list per run (in seed order)."""
    return [(row.label, [scores[r["run"]]["hypotheses"] for r in row.per_run]) for row in scored]


def _split_text(scored: list[GroupRow], scores: dict) -> tuple[list[str], list[str]] | None:
    """The split's sources and references the groups were scored on; None when they were
    scored on different references.

    Raises:
        StudyError: when the files are gone or differ from the ones scored (a run record read
            where the data is not prepared, or prepared differently).
    """
    from seq2seq.data.text_files import DataError
    from seq2seq.inference.evaluation import read_parallel

    firsts = [scores[row.per_run[0]["run"]] for row in scored]
    if len({first["ref_sha256"] for first in firsts}) != 1:
        return None
    first = firsts[0]
    try:
        sources, references = read_parallel(first["src"], first["ref"])
    except (DataError, OSError) as error:
        message = (f"the scored split's files are not readable here ({error}): prepare the "
                   "data first (make data), from the folder compare.py ran in")
        raise StudyError(message) from error
    if sha256_lines(references) != first["ref_sha256"]:
        raise StudyError(f"{first['ref']} differs from the references the runs were scored on")
    return sources, references


def _sentence_test(scored: list[GroupRow], scores: dict, test: str, samples: int,
                   text: tuple[list[str], list[str]] | None) -> str:
    """Fill each row's p-value of the sentence-level test against the best group; returns the
    test's description, or why it was not run."""
    if test == "none":
        return "not computed"
    if len(scored) < 2:
        return "needs two groups"
    if text is None:
        return "not computed: the groups were scored on different references"
    p_values = significance(_outputs(scored, scores), text[1], test=test, samples=samples)
    for row in scored:
        row.p_value = p_values.get(row.label)
    name = "paired bootstrap resampling" if test == "bs" else "paired approximate randomization"
    count = samples or (1000 if test == "bs" else 10000)
    return (f"sacreBLEU {name} ({count} samples) of BLEU against the best group, on "
            f"{min(row.runs for row in scored)} seed(s) per group pooled")


def _plots(output: Path, scored: list[GroupRow], logs: dict[str, TrainingLog], scores: dict,
           options: ScoringOptions, sections: dict[str, list[dict[str, Any]]]) -> list[Path]:
    from seq2seq.study import plots

    files = []
    for name, curve, x_label in (("valid_bleu_curves.png", "bleu_curve", "training minutes"),
                                 ("valid_bleu_by_step.png", "bleu_steps", "optimizer steps")):
        curves = {row.label: [getattr(logs[r["run"]], curve) for r in row.per_run
                              if r["run"] in logs] for row in scored}
        files.append(plots.plot_bleu_curves(output / name, curves, x_label=x_label))
    files.append(plots.plot_group_bleu(
        output / f"{options.split}_bleu.png",
        [(row.label, row.bleu[0], row.bleu[1], [r["bleu"] for r in row.per_run])
         for row in scored], split=options.split))
    heatmaps = []
    for row in scored:
        best_run = max(row.per_run, key=lambda r: r["bleu"])
        heatmap = scores[best_run["run"]].get("heatmap")
        if heatmap:
            heatmaps.append((f"{row.label}\n(seed {best_run['seed']})", heatmap))
    if heatmaps:
        files.append(plots.plot_heatmaps(output / "attention_heatmaps.png", heatmaps))
    for section, name, plot in (("length", "bleu_by_length", plots.plot_length_buckets),
                                ("positions", "accuracy_by_position", plots.plot_positions),
                                ("faithfulness", "faithfulness", plots.plot_faithfulness)):
        if sections[section]:
            files.append(plot(output / f"{options.split}_{name}.png", sections[section],
                              split=options.split))
    return files
