"""A scored run kept as one small file, so that a study's report can be rebuilt without its runs.

What a record holds, and how ``compare.py`` reads records back: docs/compare.md, "Run records".
"""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from seq2seq.atomic import write_bytes
from seq2seq.study.logs import TrainingLog

RECORD_SUFFIX = ".run.json.gz"
RECORD_VERSION = 1


@dataclass
class Record:
    """A run record read back: where the run was, its flattened config, scores and log."""

    run: str
    config: dict[str, Any]
    scores: dict[str, Any]
    log: TrainingLog


def record_name(run_dir: Path) -> str:
    """``<sweep folder>-<run folder>``: unique for the runs of a study's sweeps (a record of the
    same name is replaced)."""
    return f"{run_dir.parent.name}-{run_dir.name}{RECORD_SUFFIX}"


def _portable(path: str) -> str:
    """``path`` relative to the working folder when it lies below it (the prepared data of the
    repository, found again in another checkout), else as it is."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path


def write_record(folder: str | Path, run_dir: Path, config: dict[str, Any],
                 scores: dict[str, Any], log: TrainingLog) -> Path:
    """Write the record of the run in ``run_dir`` (its flattened ``config``, ``scores`` and
    ``log``) into ``folder``; returns its path."""
    scores = {k: v for k, v in scores.items() if k != "cached"}
    scores["src"], scores["ref"] = _portable(scores["src"]), _portable(scores["ref"])
    document = {"version": RECORD_VERSION, "run": str(Path(run_dir).resolve()),
                "config": config, "log": asdict(log), "scores": scores}
    text = json.dumps(document, separators=(",", ":"), sort_keys=True).encode("utf-8")
    path = Path(folder) / record_name(Path(run_dir))
    # mtime=0: the same scores give the same bytes (a rerun leaves git with nothing to commit).
    write_bytes(path, gzip.compress(text, mtime=0))
    return path


def is_record(path: Path) -> bool:
    return path.name.endswith(RECORD_SUFFIX) and path.is_file()


def read_record(path: str | Path) -> Record:
    """Read a record (its config's lists come back as lists).

    Raises:
        ValueError: when the file is not a readable record.
    """
    path = Path(path)
    try:
        document = json.loads(gzip.decompress(path.read_bytes()))
        if not isinstance(document, dict) or document.get("version") != RECORD_VERSION:
            raise ValueError(f"not a version-{RECORD_VERSION} run record")
        log = dict(document["log"])
        for curve in ("bleu_curve", "bleu_steps"):
            log[curve] = [tuple(point) for point in log.get(curve, [])]
        return Record(run=str(document["run"]), config=dict(document["config"]),
                      scores=dict(document["scores"]), log=TrainingLog(**log))
    except (OSError, ValueError, EOFError, KeyError, TypeError) as error:
        raise ValueError(f"cannot read the record {path}: {error}") from error


def scored_with(record: Record, wanted: dict[str, Any]) -> bool:
    """Whether the record's scores were made with ``wanted``
    (:func:`seq2seq.study.scoring.settings_key`): the same cache version and settings."""
    key = record.scores.get("key") or {}
    return {name: key.get(name) for name in wanted} == wanted
