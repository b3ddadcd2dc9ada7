"""Training runs on disk: find them, tell what differs between them, group them.

What a run is (a run folder, a run record), when it is complete, and how runs are grouped and
labelled: docs/compare.md, "What `compare.py` does" and "Parallel local sweeps" (a run cut off).
Runs are compared on their flattened configs (dotted keys) plus Hydra's group choices
(``model/attention: dot``, from ``.hydra/hydra.yaml``) where present.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from seq2seq.checkpoint import TRAINED_PRECISION
from seq2seq.models import registry
from seq2seq.study.labels import EXPERIMENT_CHOICE, MISSING, settings_text, short_labels
from seq2seq.study.records import Record, is_record, read_record

SEED_KEY = "trainer.seed"
PRECISION_KEY = "trainer.precision"
# The trainer's line for what precision=auto chose (seq2seq.device.choose_precision): what
# says it for a run from before the config recorded it (TRAINED_PRECISION).
AUTO_PRECISION_LINE = re.compile(r"trainer\.precision=auto -> (\w+) ")
# Options a built-in class gained after runs were recorded, with the value that computes what
# those runs computed: a run that sets it to that value reads as one without the key, so the
# runs of one setting before and after the option stay one group (general's 1/sqrt(d)).
ADDED_OPTIONS: dict[str, dict[str, Any]] = {"general": {"scale": False}}


class StudyError(Exception):
    """A problem with the runs or options given (shown as one line)."""


@dataclass
class Run:
    """One run folder or run record.

    ``config`` is flattened, dotted keys (``model.attention._target_``), plus Hydra's group
    choices as ``group/name`` keys; ``checkpoint`` is ``checkpoints/best.pt`` when it exists;
    ``failure`` says why the run cannot be scored (None for a complete run); ``recorded`` is a
    run record's :class:`~seq2seq.study.records.Record`.
    """

    path: Path
    config: dict[str, Any]
    checkpoint: Path | None
    failure: str | None = None
    recorded: Record | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def seed(self) -> Any:
        return self.config.get(SEED_KEY)


@dataclass
class Group:
    """Runs that share every differing key except the seed: ``label`` is what tells the group
    from the others (``scaled_dot + sparsemax``), ``values`` the differing choices and keys that
    name it, with its values."""

    label: str
    runs: list[Run] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def settings(self) -> str:
        """The settings that name the group in full (``experiment=multi30k_luong_fast,
        model/attention=scaled_dot, model.attention.normalizer=sparsemax``)."""
        return settings_text(self.values)

    @property
    def ok_runs(self) -> list[Run]:
        return sorted((r for r in self.runs if r.ok), key=lambda r: (str(r.seed), str(r.path)))

    @property
    def failed_runs(self) -> list[Run]:
        return [r for r in self.runs if not r.ok]


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists become tuples (hashable)."""
    if isinstance(node, Mapping):
        flat: dict[str, Any] = {}
        for key, value in node.items():
            flat.update(flatten(value, f"{prefix}{key}."))
        if not node and prefix:
            flat[prefix[:-1]] = "{}"
        return flat
    if isinstance(node, list):
        return {prefix[:-1]: _hashable(node)}
    return {prefix[:-1]: node}


def without_added_defaults(flat: dict[str, Any]) -> dict[str, Any]:
    """``flat`` without the options of :data:`ADDED_OPTIONS` that are set to the value the runs
    before them computed with (a multi-head scorer's inner scorer included), nor the model
    options of :data:`~seq2seq.models.registry.ADDED_MODEL_OPTIONS` set to theirs."""
    for option, default in registry.ADDED_MODEL_OPTIONS.items():
        if f"model.{option}" in flat and repr(flat[f"model.{option}"]) == repr(default):
            del flat[f"model.{option}"]
    for key, value in list(flat.items()):
        if key.endswith("._target_") and isinstance(value, str) and value in ADDED_OPTIONS:
            node = key.removesuffix("_target_")
            for option, default in ADDED_OPTIONS[value].items():
                if node + option in flat and repr(flat[node + option]) == repr(default):
                    del flat[node + option]
    return flat


def with_trained_precision(flat: dict[str, Any], train_log: Path) -> dict[str, Any]:
    """``flat`` with ``trainer.precision`` replaced by the precision the run trained in, which
    its config records (``trained_precision``, :data:`~seq2seq.checkpoint.TRAINED_PRECISION`):
    a run pinned to bf16 and one where auto chose bf16 trained alike, and group together.

    A run from before that record keeps ``trainer.precision=auto`` in its config, and only its
    ``train.log`` says what auto chose: read there, the one place old runs need; ``auto``
    stays where the log does not say either.
    """
    trained = flat.get(TRAINED_PRECISION)
    if trained is not None:
        return {**{key: value for key, value in flat.items() if key != TRAINED_PRECISION},
                PRECISION_KEY: trained}
    if flat.get(PRECISION_KEY) != "auto":
        return flat
    try:
        with open(train_log, encoding="utf-8", errors="replace") as log:
            for line in log:
                match = AUTO_PRECISION_LINE.search(line)
                if match:
                    return {**flat, PRECISION_KEY: match.group(1)}
    except OSError:
        pass
    return flat


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, Mapping):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise StudyError(f"cannot read {path}: {error}") from error


def _read_config(path: Path) -> Any:
    """A config file as plain containers, interpolations resolved where they can be."""
    from omegaconf import OmegaConf

    config = _read_yaml(path)
    if not isinstance(config, Mapping):
        return config
    try:
        return OmegaConf.to_container(OmegaConf.create(config), resolve=True)
    except Exception:  # e.g. ${hydra:...} outside Hydra: keep the text
        return config


def read_run(folder: Path) -> Run:
    """The run in ``folder`` (which holds ``config.yaml`` or ``.hydra/config.yaml``)."""
    folder = Path(folder)
    config_path = folder / "config.yaml"
    if not config_path.is_file():
        config_path = folder / ".hydra" / "config.yaml"
    config = _read_config(config_path)
    if not isinstance(config, Mapping):
        return Run(folder, {}, None, failure=f"{config_path} holds no config")
    flat = without_added_defaults(flatten(registry.upgrade_config(dict(config), 1)))  # old runs
    flat = with_trained_precision(flat, folder / "train.log")
    hydra_path = folder / ".hydra" / "hydra.yaml"
    if hydra_path.is_file():
        try:
            choices = (_read_yaml(hydra_path) or {})["hydra"]["runtime"]["choices"]
        except (KeyError, TypeError, StudyError):
            choices = {}
        for group, option in (choices or {}).items():
            if not str(group).startswith("hydra/"):
                flat[str(group) if "/" in str(group) else f"{group}/"] = option
    checkpoint = folder / "checkpoints" / "best.pt"
    if checkpoint.is_file():
        return Run(folder, flat, checkpoint, failure=_unfinished(folder, config))
    reason = "no checkpoints/best.pt"
    if not (folder / "config.yaml").is_file():
        reason += " (training never started: no config.yaml)"
    return Run(folder, flat, None, failure=reason)


def _unfinished(folder: Path, config: Mapping[str, Any]) -> str | None:
    """Why a run with a ``best.pt`` is not finished: it has no ``last.pt`` (the trainer writes one
    at the end), or its ``last.pt`` says it had training left (it was cut off); None when it
    finished, or when its ``last.pt`` cannot tell."""
    last = folder / "checkpoints" / "last.pt"
    if not last.is_file():
        return ("unfinished: no checkpoints/last.pt yet (still training, or cut off before its "
                "first; run the sweep again with trainer.resume=auto to finish it)")
    from seq2seq.checkpoint import CheckpointError, load_checkpoint
    from seq2seq.config_types import ConfigError
    from seq2seq.training.budget import training_over
    from seq2seq.training.settings import TrainerSettings
    from seq2seq.training.state import TrainerState

    try:
        settings = TrainerSettings.from_dict(config.get("trainer") or {})
        state = TrainerState()
        state.load_state_dict(load_checkpoint(last, mmap=True)["trainer_state"])
    except (CheckpointError, ConfigError, KeyError, TypeError, ValueError):
        return None  # an older or damaged last.pt: best.pt is what there is
    if training_over(state, settings):
        return None
    return (f"unfinished: its last.pt is at step {state.step} with budget left (still training, "
            f"or cut off; run the sweep again with trainer.resume=auto to finish it)")


def _is_run_folder(folder: Path) -> bool:
    return (folder / "config.yaml").is_file() or (folder / ".hydra" / "config.yaml").is_file()


def find_run_folders(root: Path, depth: int = 6) -> list[Path]:
    """Run folders and run records at or below ``root``, at most ``depth`` levels down.

    A run folder's own subfolders, hidden folders (``.submitit``, ``.venv``) and symbolic
    links are not searched.
    """
    if _is_run_folder(root):
        return [root]
    if depth == 0:
        return []
    found: list[Path] = []
    try:
        entries = sorted(p for p in root.iterdir()
                         if not p.is_symlink() and not p.name.startswith("."))
    except OSError as error:
        raise StudyError(f"cannot list {root}: {error}") from error
    for entry in entries:
        if entry.is_dir():
            found.extend(find_run_folders(entry, depth - 1))
        elif is_record(entry):
            found.append(entry)
    return found


def discover_runs(specs: Sequence[str]) -> list[Run]:
    """The runs named by folders (a sweep folder, run folders), run records or globs, without
    duplicates.

    A record of a run whose folder is also found is left out (the folder is the run), as is a
    second record of the same run.

    Raises:
        StudyError: when a name matches nothing, or no run folder is found at all.
    """
    if not specs:
        raise StudyError("no run folder given: compare.py SWEEP_DIR or RUN_DIR RUN_DIR ...")
    folders: dict[Path, Path] = {}
    for spec in specs:
        matches = [Path(p) for p in glob.glob(str(Path(spec).expanduser()))] \
            if glob.has_magic(spec) else [Path(spec).expanduser()]
        matches = [m for m in matches if m.is_dir() or is_record(m)]
        if not matches:
            raise StudyError(f"no such folder: {spec}")
        for match in sorted(matches):
            for folder in [match] if is_record(match) else find_run_folders(match):
                folders.setdefault(folder.resolve(), folder)
    if not folders:
        raise StudyError(
            f"no run folder (one with config.yaml or .hydra/config.yaml) or run record "
            f"(*.run.json.gz) in {' '.join(specs)}"
        )
    runs = [_read_found(found) for found in sorted(folders.values(), key=_natural_key)]
    seen = {str(path) for path in folders if not is_record(path)}
    kept = []
    for run in runs:
        if run.recorded is not None:
            if run.recorded.run in seen:
                continue
            seen.add(run.recorded.run)
        kept.append(run)
    return kept


def _read_found(path: Path) -> Run:
    if not is_record(path):
        return read_run(path)
    try:
        record = read_record(path)
    except ValueError as error:
        return Run(path, {}, None, failure=str(error))
    config = without_added_defaults({
        key: _hashable(registry.name_of_v1_target(value) if key.endswith("._target_") else value)
        for key, value in record.config.items()})
    return Run(path, config, None, recorded=record)


def _natural_key(path: Path) -> tuple:
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in path.parts)


def is_choice(key: str) -> bool:
    """Whether ``key`` is a Hydra group choice (``model/attention``) rather than a config key."""
    return "/" in key


def differing_keys(runs: Iterable[Run]) -> list[str]:
    """The keys whose values are not the same in every run (a missing key counts).

    Group choices are compared only between runs that recorded them (a run folder without
    ``.hydra/`` has none).
    """
    runs = list(runs)
    keys = sorted({key for run in runs for key in run.config})
    differing = []
    for key in keys:
        among = [r for r in runs if any(is_choice(k) for k in r.config)] if is_choice(key) \
            else runs
        if len({repr(run.config.get(key, MISSING)) for run in among}) > 1:
            differing.append(key)
    return differing


def choice_node(choice: str) -> str:
    """The prefix of the config keys a choice sets: ``model.attention.`` for ``model/attention``,
    ``optimizer.`` for ``optimizer/``; ``""`` for an experiment preset, a global package whose
    keys may be anywhere."""
    return "" if choice == EXPERIMENT_CHOICE else choice.rstrip("/").replace("/", ".") + "."


def label_keys(keys: Sequence[str], runs: Sequence[Run]) -> list[str]:
    """The keys worth showing: a differing group choice hides the config keys it implies.

    A config key under a choice's node (``model.attention.*`` for ``model/attention``) is
    implied when runs with the same choice agree on it; one set on the command line on top of
    the choice (``model.attention.normalizer=sparsemax``) differs within a choice and is shown.
    An experiment preset implies every choice and key that takes one value per preset
    (``experiment=multi30k_transformer`` fixes ``model/decoder`` and ``batch.max_tokens``).
    """
    choices = [k for k in keys if is_choice(k)]

    def determines(choice: str, key: str) -> bool:
        """Whether the runs that agree on ``choice`` all agree on ``key``; a run that recorded
        no choices counts as one more value, so a key that tells such runs apart stays shown."""
        seen: dict[str, str] = {}
        return all(seen.setdefault(repr(r.config.get(choice, MISSING)), value) == value
                   for r in runs for value in [repr(r.config.get(key, MISSING))])

    def implied(key: str) -> bool:
        return any(key.startswith(choice_node(choice)) and determines(choice, key)
                   for choice in choices if choice != key)

    # Choices first (less those a preset fixes): they name the group; the keys set on top follow.
    return [k for k in choices if not implied(k)] + [
        k for k in keys if not is_choice(k) and not implied(k)
    ]


def group_runs(runs: Sequence[Run]) -> tuple[list[str], list[Group]]:
    """Group runs by every differing config key but the seed.

    The groups are made from config keys alone (a choice is seen through the values it sets);
    their settings are the differing group choices where the runs recorded them, and the config
    keys those do not imply; their labels, what of those tells them apart
    (:func:`seq2seq.study.labels.short_labels`).

    Returns:
        ``(keys, groups)``: the differing keys (seed excluded, choices included) and the
        groups, in the order their first run was found.
    """
    # A run whose config could not be read would make every key differ.
    keys = [k for k in differing_keys([r for r in runs if r.config]) if k != SEED_KEY]
    config_keys = [k for k in keys if not is_choice(k)]
    shown = label_keys(keys, runs) or keys
    members: dict[tuple, list[Run]] = {}
    for run in runs:
        key = tuple((k, _hashable(run.config.get(k, MISSING))) for k in config_keys)
        members.setdefault(key, []).append(run)
    groups = []
    for group_runs_ in members.values():
        labelled = next((r for r in group_runs_ if any(is_choice(k) for k in r.config)),
                        group_runs_[0])
        # A choice set to null (model/attention=null) has no node: nothing under it to show.
        absent = [choice_node(c) for c, v in labelled.config.items()
                  if is_choice(c) and c != EXPERIMENT_CHOICE and v is None]
        values = {k: labelled.config.get(k, MISSING) for k in shown
                  if not any(k.startswith(node) for node in absent)}
        groups.append(Group(label="", runs=group_runs_, values=values))
    labels, _ = short_labels([group.values for group in groups])
    for group, label in zip(groups, labels, strict=True):
        group.label = label
    return keys, groups


def left_out_of_labels(groups: Sequence[Group]) -> dict[str, Any]:
    """The values most groups share, which their labels leave out (key -> value)."""
    return short_labels([group.values for group in groups])[1]


def shared_settings(runs: Iterable[Run]) -> dict[str, Any]:
    """The choices and config keys every run with a readable config has, with one value."""
    configs = [run.config for run in runs if run.config]
    if not configs:
        return {}
    return {key: value for key, value in sorted(configs[0].items())
            if all(key in c and repr(c[key]) == repr(value) for c in configs[1:])}
