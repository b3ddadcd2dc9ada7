"""``--help`` of the Hydra entry points, made from the comments of their YAML configs.

Each option of a config file is a line ``key: value  # what it does``; the comment is the
option's description (a key without a trailing comment takes the comment lines just above
it). One source for ``--help``, docs/configuration.md (checked against it by
tests/test_docs.py) and the file a user reads, so none of them can drift from the others. The
decoding options (``beam_size``, ``search``, ...) are described where they are declared,
:class:`~seq2seq.inference.decode_options.DecodeOptions`, unless a file adds its tool's own words.
The files are read with ruamel.yaml, which keeps the comments and where each key stands.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seq2seq import CONFIG_DIR
from seq2seq.inference.decode_options import described_options


@dataclass(frozen=True)
class Option:
    """One option of a config file: its dotted key, default (as written) and description."""

    key: str
    default: str
    description: str


def _comment_tokens(node: Any) -> Iterator[Any]:
    """Every comment token ruamel.yaml attached to ``node`` and the nodes inside it."""
    attached = getattr(node, "ca", None)
    pending = [] if attached is None else [attached.comment, list(attached.items.values()),
                                           attached.end]
    while pending:
        item = pending.pop()
        if isinstance(item, list):
            pending += item
        elif item is not None:
            yield item
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    for child in children:
        yield from _comment_tokens(child)


def _comments_by_line(document: Any) -> dict[int, tuple[int, str]]:
    """Line -> (column of its ``#``, text after it) for every comment of a loaded file.

    ruamel.yaml attaches a comment to a neighbouring node, not always the one it describes
    (the lines above a key go with the key before it), so comments are placed by their lines.
    A token's mark is its first ``#``; the newlines before it end earlier lines.
    """
    comments = {}
    for token in _comment_tokens(document):
        lines = token.value.lstrip("\n").split("\n")
        for offset, line in enumerate(lines):
            if line.strip().startswith("#"):
                column = token.start_mark.column if offset == 0 else len(line) - len(line.lstrip())
                comments[token.start_mark.line + offset] = (column, line.strip()[1:].strip())
    return comments


def parse_options(path: Path, prefix: str = "") -> list[Option]:
    """The options of one YAML config file, in file order.

    Left out: the ``defaults`` list and the ``hydra`` node (composition, not options), keys that
    start with ``_`` (``_target_``, ``_partial_``), and nodes that hold other keys (their keys are
    listed instead). ``prefix`` goes before every key (``trainer.`` for trainer/default.yaml).
    """
    from ruamel.yaml import YAML

    text = path.read_text(encoding="utf-8")
    document = YAML().load(text)
    if not isinstance(document, dict):
        return []
    lines = text.splitlines()
    comments = _comments_by_line(document)
    key_lines: set[int] = set()
    found: list[tuple[str, int, int]] = []  # (dotted key, its line, its value's column)

    def walk(node: dict, dotted: str, top: bool) -> None:
        for key, value in node.items():
            line, _ = node.lc.key(key)
            key_lines.add(line)
            if top and key in ("defaults", "hydra"):
                continue
            if isinstance(value, dict) and value:
                walk(value, f"{dotted}{key}.", False)
            elif not str(key).startswith("_"):
                found.append((f"{dotted}{key}", line, node.lc.value(key)[1]))

    walk(document, prefix, True)
    options = []
    for key, line, column in found:
        end_comment = comments.get(line)
        written = lines[line][column:end_comment[0] if end_comment else None].strip()
        above = []
        for before in range(line - 1, -1, -1):  # the comment lines right above the key
            if before in key_lines or before not in comments:
                break
            above.insert(0, comments[before][1])
        description = end_comment[1] if end_comment else " ".join(part for part in above if part)
        options.append(Option(key, written, description))
    return options


def group_prefix(path: Path) -> str:
    """The package a group option's keys go under: ``trainer.`` for trainer/default.yaml,
    ``model.attention.`` for model/attention/dot.yaml, nothing for a global preset."""
    relative = path.relative_to(CONFIG_DIR)
    if len(relative.parts) == 1 or "# @package _global_" in path.read_text(encoding="utf-8"):
        return ""
    return ".".join(relative.parts[:-1]) + "."


def group_choices(group: str) -> list[str]:
    return sorted(path.stem for path in (CONFIG_DIR / group).glob("*.yaml"))


def two_columns(rows: Sequence[tuple[str, str]], width: int) -> list[str]:
    """Two columns: the name, then its text wrapped under itself."""
    name_width = min(max((len(name) for name, _ in rows), default=0), 34) + 2
    lines = []
    for name, text in rows:
        wrapped = textwrap.wrap(text, max(width - name_width - 2, 30)) or [""]
        if len(name) + 2 > name_width:  # the text starts on the line below
            lines.append(f"  {name}")
        else:
            lines.append(f"  {name:<{name_width}}{wrapped.pop(0)}")
        lines += [" " * (name_width + 2) + part for part in wrapped]
    return lines


def format_value(value: Any) -> str:
    """A default as a user would type it on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(format_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{}" if not value else str(value)
    return str(value)


def render_help(config_name: str, command: str, overrides: Sequence[str] = (), *,
                summary: str = "", width: int | None = None) -> str:
    """The ``--help`` text of the tool whose primary config is ``config_name``.

    The config is composed as the command line would compose it (``overrides``: a preset or
    another group choice changes what is listed, e.g. ``model/attention=multihead --help``),
    so every option shows the default that run would get. The groups and their choices come
    first, then every option with the comment of the file that declares it.
    """
    from omegaconf import OmegaConf

    from seq2seq.cli.common import compose_config, config_leaves

    width = width or min(shutil.get_terminal_size((100, 20)).columns, 110)
    cfg = compose_config(config_name, overrides) or compose_config(config_name)
    # Hydra lists the choices last-composed first: shown here in the defaults list's order.
    choices = {group: format_value(option)
               for group, option in reversed(list(cfg.hydra.runtime.choices.items()))
               if not group.startswith("hydra/") and group != "hydra"}
    files = [CONFIG_DIR / f"{config_name}.yaml"] + [
        CONFIG_DIR / group / f"{option}.yaml" for group, option in choices.items()
        if option != "null"]
    descriptions: dict[str, str] = {}
    # A preset's comments only where no group file describes the key (they say why a value).
    for path in sorted((f for f in files if f.is_file()), key=lambda f: "experiment" in f.parts):
        for option in parse_options(path, group_prefix(path)):
            if option.description:
                descriptions.setdefault(option.key, option.description)
    # How to decode: DecodeOptions says, where a file does not say more for its tool.
    for key, (_, _, meaning) in described_options().items():
        descriptions.setdefault(key, meaning)
    plain = OmegaConf.to_container(cfg, resolve=False)
    plain.pop("hydra", None)
    summary = (summary or "").replace("``", "`")
    lines = [f"usage: {command} [key=value ...]", "", summary, ""]
    if choices:
        lines.append("Config groups (group=choice; the chosen one first):")
        lines += two_columns([(group, " | ".join([option] + [c for c in group_choices(group)
                                                       if c != option]))
                          for group, option in choices.items()], width)
        lines.append("")
    lines.append("Options (key=value):")
    rows = []
    for key, value in config_leaves(plain):
        default = "required" if value == "???" else f"default {format_value(value)}"
        rows.append((key, f"{descriptions.get(key, '')} [{default}]".strip()))
    lines += two_columns(rows, width)
    lines += ["", "Every option is described in docs/configuration.md; "
              "Hydra's own flags: --hydra-help."]
    return "\n".join(line.rstrip() for line in lines) + "\n"
