"""One row per group: means and standard deviations over seeds, significance, the files.

The columns, and the pooled outputs of the sentence-level test: docs/compare.md, "What
`compare.py` does" (its table of columns) and "Significance over seeds" ("Pooled outputs"). A
standard deviation is the sample one, ``-`` for a single run; a group's first ``n`` seeds are its
runs sorted by seed (:attr:`~seq2seq.study.runs.Group.ok_runs`).
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from seq2seq.inference.evaluation import COVERAGE_THRESHOLD
from seq2seq.study import markdown
from seq2seq.study.labels import value_text
from seq2seq.study.logs import TrainingLog
from seq2seq.study.runs import Group
from seq2seq.study.scoring import ATTENTION_STATS

NAN = math.nan


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (NaN when undefined); NaN inputs are left out."""
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return NAN, NAN
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else NAN


@dataclass
class GroupRow:
    """The numbers of one group (see :func:`summarize`); ``label`` is its short label,
    ``settings`` what names it in full."""

    label: str
    runs: int
    failed: int
    seeds: list[Any]
    parameters: int | None
    tokens_per_second: float
    steps: float
    bleu: tuple[float, float]
    chrf: tuple[float, float]
    sentences_per_second: float
    attention_entropy: float
    attention_max_weight: float
    attention_backward_moves: float
    attention_coverage: float
    p_value: float | None = None
    aso_vs_best: float | None = None
    aso_provisional: bool = False
    best: bool = False
    per_run: list[dict[str, Any]] = field(default_factory=list)
    settings: str = ""


def summarize(
    group: Group, scores: Mapping[str, Mapping[str, Any]], logs: Mapping[str, TrainingLog]
) -> GroupRow:
    """Aggregate a group's complete runs; ``scores``/``logs`` are keyed by ``str(run.path)``."""
    per_run = []
    for run in group.ok_runs:
        score, log = scores[str(run.path)], logs.get(str(run.path), TrainingLog())
        per_run.append({
            "run": str(run.path), "seed": run.seed, "bleu": score["bleu"], "chrf": score["chrf"],
            "sentences_per_second": score["sentences_per_second"],
            **{name: score[name] for name in ATTENTION_STATS},
            "faithfulness": score.get("faithfulness"),
            "parameters": score["parameters"], "tokens_per_second": log.tokens_per_second,
            "steps": log.steps,
        })

    def avg(name: str) -> float:
        return mean_std([r[name] for r in per_run])[0]

    return GroupRow(
        label=group.label, runs=len(per_run), failed=len(group.failed_runs),
        seeds=[r["seed"] for r in per_run],
        parameters=per_run[0]["parameters"] if per_run else None,
        tokens_per_second=avg("tokens_per_second"), steps=avg("steps"),
        bleu=mean_std([r["bleu"] for r in per_run]), chrf=mean_std([r["chrf"] for r in per_run]),
        sentences_per_second=avg("sentences_per_second"),
        **{name: avg(name) for name in ATTENTION_STATS}, per_run=per_run, settings=group.settings,
    )


def significance(
    systems: Sequence[tuple[str, Sequence[Sequence[str]]]],
    references: Sequence[str],
    *,
    test: str = "bs",
    samples: int = 0,
) -> dict[str, float | None]:
    """p-values of each system against the first (the baseline: None), on pooled outputs.

    ``systems``: ``(name, per-seed hypothesis lists)``, best system first, each list answering
    ``references`` (one copy of the split) line by line. ``test``: ``bs`` (paired bootstrap) or
    ``ar`` (paired approximate randomization); ``samples``: its resamples or trials (0:
    sacreBLEU's default, 1000 for bs, 10000 for ar).
    """
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    if len(systems) < 2:
        return {name: None for name, _ in systems}
    seeds = min(len(outputs) for _, outputs in systems)
    if seeds == 0:
        raise ValueError("every system needs at least one output")
    named = [(name, [h for hyps in outputs[:seeds] for h in hyps]) for name, outputs in systems]
    pooled_refs = list(references) * seeds
    test_ = PairedTest(named, {"BLEU": BLEU()}, [pooled_refs], test_type=test, n_samples=samples)
    _, results = test_()
    p_values = [result.p_value for result in results["BLEU"]]
    return {name: p for (name, _), p in zip(named, p_values, strict=True)}


# -- formatting ------------------------------------------------------------------------------
COLUMNS = ["group", "runs", "failed", "params", "train tok/s", "steps", "BLEU", "chrF",
           "sent/s", "attn entropy", "attn max weight", "attn backward", "attn coverage",
           "ASO eps_min vs best",
           "p vs best (sentences)"]


def _number(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _pm(pair: tuple[float, float]) -> str:
    mean, std = pair
    return f"{_number(mean)} ± {_number(std)}" if not math.isnan(std) else _number(mean)


def _p(row: GroupRow) -> str:
    if row.best:
        return "best"
    return "-" if row.p_value is None else f"{row.p_value:.4f}"


def _aso(row: GroupRow) -> str:
    if row.best:
        return "best"
    if row.aso_vs_best is None:
        return "-"
    return f"{row.aso_vs_best:.3f}" + (" (provisional)" if row.aso_provisional else "")


def markdown_table(rows: Sequence[GroupRow]) -> str:
    return "\n".join(markdown.table(COLUMNS, (
        [row.label, str(row.runs), str(row.failed),
         f"{row.parameters:,}" if row.parameters else "-",
         _number(row.tokens_per_second, 0), _number(row.steps, 0), _pm(row.bleu),
         _pm(row.chrf), _number(row.sentences_per_second, 1),
         *(_number(getattr(row, name), 3) for name in ATTENTION_STATS),
         _aso(row), _p(row)] for row in rows)))


def _plain(value: Any) -> Any:
    """JSON-safe: NaN becomes null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def row_dict(row: GroupRow) -> dict[str, Any]:
    return {
        "group": row.label, "settings": row.settings, "runs": row.runs, "failed": row.failed, "seeds": row.seeds,
        "parameters": row.parameters, "train_tokens_per_second": row.tokens_per_second,
        "steps": row.steps, "bleu_mean": row.bleu[0], "bleu_std": row.bleu[1],
        "chrf_mean": row.chrf[0], "chrf_std": row.chrf[1],
        "sentences_per_second": row.sentences_per_second,
        **{name: getattr(row, name) for name in ATTENTION_STATS},
        "aso_eps_min_vs_best": row.aso_vs_best,
        "aso_provisional": row.aso_provisional, "p_value": row.p_value, "best": row.best,
    }


def csv_text(rows: Sequence[GroupRow]) -> str:
    buffer = io.StringIO()
    records = [row_dict(row) for row in rows]
    writer = csv.DictWriter(buffer, fieldnames=list(records[0]) if records else ["group"],
                            lineterminator="\n")
    writer.writeheader()
    for record in records:
        record["seeds"] = " ".join(str(s) for s in record["seeds"])
        writer.writerow({k: "" if v is None else v for k, v in _plain(record).items()})
    return buffer.getvalue()


def json_text(rows: Sequence[GroupRow], failed: Sequence[Mapping[str, Any]],
              meta: Mapping[str, Any]) -> str:
    document = {**meta, "groups": [{**row_dict(row), "per_run": row.per_run} for row in rows],
                "failed_runs": list(failed)}
    return json.dumps(_plain(document), indent=2) + "\n"


def _setting(key: str, value: Any) -> str:
    return f"{key.rstrip('/')}={value_text(value)}"


def labels_note(meta: Mapping[str, Any]) -> list[str]:
    """What the short labels leave out, said once above the table: the choices every group
    shares, and the values most share (``experiment=multi30k_luong_fast``)."""
    shared = meta.get("shared_settings") or {}
    choices = [_setting(k, v) for k, v in shared.items() if "/" in k]
    left_out = [_setting(k, v) for k, v in (meta.get("left_out_of_labels") or {}).items()]
    text = ("Each group is labelled by what tells it from the others; its settings in full are "
            "under [The groups](#the-groups).")
    if choices:
        text += f" Every group: {', '.join(choices)}."
    others = len(shared) - len(choices)
    if others:
        text += (f" {others} more settings every run shares (config keys) are in "
                 "comparison.json's `shared_settings`.")
    if left_out:
        text += f" Unless its label says otherwise (or it lacks the setting): {', '.join(left_out)}."
    return [text, ""]


def groups_section(rows: Sequence[GroupRow]) -> list[str]:
    """Each group's label beside the settings that name it in full."""
    return markdown.section(
        "The groups", "Each label, and the differing settings of its runs in full "
        "(the seed left out):", ["group", "settings"],
        ([row.label, row.settings] for row in rows))


def markdown_report(rows: Sequence[GroupRow], failed: Sequence[Mapping[str, Any]],
                    meta: Mapping[str, Any], plots: Sequence[str] = (),
                    sections: Sequence[str] = ()) -> str:
    lines = [f"# Comparison: {meta.get('split')} split, beam {meta.get('beam_size')}", "",
             f"Runs: {meta.get('runs')}; differing keys: "
             f"{', '.join(meta.get('differing_keys') or []) or 'none'} (seed left out).", "",
             *labels_note(meta),
             markdown_table(rows), "",
             "BLEU/chrF: mean ± sample standard deviation over seeds (sacreBLEU defaults). "
             "attn entropy: mean entropy (nats) of a target step's attention; attn max weight: "
             "mean largest weight of a target step (1 = one source piece); attn backward: share "
             "of consecutive target steps whose most-attended source piece moves backwards (0 = "
             "monotonic); attn coverage: share of source pieces whose attention summed over the "
             f"steps reaches {COVERAGE_THRESHOLD} (1 = every piece attended). "
             "ASO eps_min vs best: significance over seeds (next section). "
             f"p vs best (sentences): {meta.get('significance_test')}; a sentence-level test "
             "that ignores how much a group moves between seeds.", "", *sections,
             *groups_section(rows)]
    if failed:
        lines += ["## Failed runs", ""]
        lines += [f"- `{f['run']}` ({f['group']}): {f['reason']}" for f in failed]
        lines.append("")
    if plots:
        lines += ["## Plots", ""] + [f"![{name}]({name})" for name in plots] + [""]
    return "\n".join(lines)
