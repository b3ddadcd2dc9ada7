"""What the Hydra entry points share: the config folder, one-line errors, decoding options."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from omegaconf import DictConfig, OmegaConf

from seq2seq import CONFIG_DIR
from seq2seq.config_types import ConfigError, check_value, error_reason
from seq2seq.inference.export_format import MANIFEST_NAME, is_exported


def register_decode_options() -> None:
    """Give Hydra the decoding options as the config ``decode_options``, made from
    :class:`~seq2seq.inference.decode_options.DecodeOptions`' defaults: the decoding group
    (``configs/decoding/default.yaml``) includes it, so no YAML restates them."""
    from hydra.core.config_store import ConfigStore

    from seq2seq.inference.decode_options import option_defaults

    ConfigStore.instance().store(name="decode_options", node=option_defaults())


register_decode_options()  # before any tool composes its config


def fail(message: str | BaseException) -> NoReturn:
    """Print ``error: MESSAGE`` (one line) on stderr and exit with status 1."""
    text = error_reason(message) if isinstance(message, BaseException) else message
    print(f"error: {text}", file=sys.stderr, flush=True)
    sys.exit(1)


def check_types(cfg: DictConfig, types: Mapping[str, Any]) -> None:
    """Exit with a one-line error naming the key of the first option whose value is not of its
    type (``types``: dotted key -> annotation, :func:`~seq2seq.config_types.check_value`); a
    key the config lacks is skipped."""
    for key, annotation in types.items():
        node, _, name = key.rpartition(".")
        parent = OmegaConf.select(cfg, node) if node else cfg
        if parent is None or name not in parent:
            continue
        try:
            check_value(parent[name], annotation, key)
        except ConfigError as error:
            fail(error)


def set_up_decoding(num_threads: int | None) -> None:
    """What every decoding tool sets before its first matrix product: the bound on torch's
    per-shape matmul set-up cache (:mod:`seq2seq.onednn_caches`; oneDNN's kernel cache keeps
    its default) and the CPU threads (``num_threads``; None: the cores this process may use).
    Loads torch."""
    from seq2seq.device import set_num_threads
    from seq2seq.onednn_caches import bound_onednn_caches

    bound_onednn_caches(kernels=None)
    set_num_threads(num_threads)


def check_group_overrides(overrides: Sequence[str]) -> None:
    """Exit with a one-line error when a command line sets a config group to null
    (``model/attention=null``): Hydra refuses it with its own traceback before any of our code
    runs. ``~group`` removes a group; a preset's ``override /group: null`` still works."""
    for override in overrides:
        key, equals, value = override.lstrip("+").partition("=")
        if not equals or key.startswith("~") or not (CONFIG_DIR / key).is_dir():
            continue
        if any(choice.strip().lower() == "null" for choice in value.split(",")):
            fail(f"{key}=null: a config group cannot be set to null on the command line; "
                 f"remove it with ~{key}")


def checkpoint_paths(value: Any) -> list[str]:
    """``checkpoint=PATH`` or ``checkpoint=[A,B,...]`` (an ensemble) as a list of paths."""
    if OmegaConf.is_list(value) or isinstance(value, list | tuple):
        return [str(item) for item in value]
    return [str(value)]


def require_checkpoint_files(paths: Sequence[str], *, prefix: str = "") -> None:
    """Exit with ``error: PREFIXcheckpoint not found: PATH`` for the first of `paths` that is
    neither a file nor an exported folder. Called before torch loads: a mistyped path is the
    commonest mistake."""
    for path in paths:
        if Path(path).is_dir() and not is_exported(path):
            fail(f"{prefix}{path} is a folder but not an exported model (no {MANIFEST_NAME}); "
                 "give a checkpoint file or a folder written by seq2seq-export")
        if not Path(path).is_file() and not is_exported(path):
            fail(f"{prefix}checkpoint not found: {path}")


def translator_options(cfg: DictConfig) -> dict[str, Any]:
    """The translator settings that evaluate.py, translate.py and serve.py read from config
    (the rest of what they ask is :class:`seq2seq.cli.decoding_request.DecodingRequest`).

    Raises:
        ShortlistError: (a ValueError) when ``shortlist=PATH`` cannot be read.
    """
    from seq2seq.inference.shortlist import Shortlist

    return {
        "max_tokens": cfg.batch.max_tokens,
        "max_source_length": cfg.max_source_length,
        "precision": cfg.precision,
        # A config without the key (older or hand-made) decodes in float, as before.
        "quantize": cfg.get("quantize", "none"),
        "shortlist": Shortlist.load(cfg.shortlist) if cfg.get("shortlist") else None,
    }


def without_sweeps(overrides: Sequence[str]) -> list[str]:
    """The overrides without sweeps (``trainer.seed=1,2``), which one composition cannot take."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    kept = []
    for override in overrides:
        try:
            if not parser.parse_override(override).is_sweep_override():
                kept.append(override)
        except Exception:
            continue  # an override Hydra cannot read is not one to compose with
    return kept


def compose(config_name: str, overrides: Sequence[str] = ()):
    """The config Hydra composes for one run of ``config_name`` with ``overrides``, the
    ``hydra`` node included; Hydra's exception where it cannot compose it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return hydra_compose(config_name=config_name, overrides=list(overrides),
                                 return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()


def compose_config(config_name: str, overrides: Sequence[str] = ()):
    """The config composed with ``overrides`` (sweeps left out), or None if it cannot be."""
    try:
        return compose(config_name, without_sweeps(overrides))
    except Exception:
        return None


def config_leaves(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of every option of a plain config: its leaves, an empty node
    (``data: {}``) included; ``_target_``-like keys left out."""
    if not isinstance(node, dict) or not node:
        return [(prefix.rstrip("."), node)]
    leaves = []
    for key, value in node.items():
        if not str(key).startswith("_"):
            leaves += config_leaves(value, f"{prefix}{key}.")
    return leaves
