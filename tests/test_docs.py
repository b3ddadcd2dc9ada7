"""The documentation a newcomer reads: a short README whose links work, and a configuration
reference that lists every key of every config file.

The reference (docs/configuration.md) has a section per config file: a heading that names the
file (`train.yaml`) or its group option (`model/attention=additive`) in backticks. Each key of
the file must appear in its section in backticks, as a dotted path (`model.attention.hidden_size`;
keys of a primary config as they are written on the command line, `batch.max_tokens`).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "seq2seq" / "configs"
README = ROOT / "README.md"
REFERENCE = ROOT / "docs" / "configuration.md"
MAX_README_LINES = 300

# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*)$")


def config_files() -> list[Path]:
    return sorted(CONFIGS.rglob("*.yaml"))


def config_name(path: Path) -> str:
    """`train.yaml` for a primary config, `group/sub=option` for a group option."""
    relative = path.relative_to(CONFIGS)
    if len(relative.parts) == 1:
        return relative.name
    return f"{'/'.join(relative.parts[:-1])}={relative.stem}"


def dotted_keys(node: dict, prefix: str = "", top: bool = True) -> list[str]:
    """The leaves of a config node as dotted paths; a non-empty mapping is walked, not listed.
    A file's own defaults list (composition, not an option) is left out."""
    keys = []
    for key, value in node.items():
        if key == "defaults" and top:
            continue
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            keys.extend(dotted_keys(value, f"{path}.", top=False))
        else:
            keys.append(path)
    return keys


def config_keys(path: Path) -> list[str]:
    """Every key of a config file as a user writes it on the command line."""
    text = path.read_text(encoding="utf-8")
    relative = path.relative_to(CONFIGS)
    is_global = re.search(r"^#\s*@package\s+_global_\s*$", text, re.MULTILINE) is not None
    in_group = len(relative.parts) > 1 and not is_global
    prefix = ".".join(relative.parts[:-1]) + "." if in_group else ""
    return dotted_keys(yaml.safe_load(text) or {}, prefix)


def sections(markdown: str) -> list[tuple[str, str]]:
    """(heading, body) for every heading outside code fences; the body runs to the next heading
    of the same or a higher level, so it includes its subsections."""
    lines = markdown.splitlines()
    headings: list[tuple[int, int, str]] = []  # (line index, level, text)
    in_fence = False
    for index, line in enumerate(lines):
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
            continue
        match = None if in_fence else HEADING.match(line)
        if match:
            headings.append((index, len(match.group(1)), match.group(2)))
    found = []
    for position, (index, level, text) in enumerate(headings):
        end = len(lines)
        for later_index, later_level, _ in headings[position + 1:]:
            if later_level <= level:
                end = later_index
                break
        found.append((text, "\n".join(lines[index + 1:end])))
    return found


def mentions(text: str, key: str) -> bool:
    """`key` in backticks, alone or as `key=value`."""
    return re.search(rf"`{re.escape(key)}(=[^`]*)?`", text) is not None


def missing_keys(reference: str) -> list[str]:
    """`file: key` for every key not listed in its file's section of the reference."""
    found = sections(reference)
    missing = []
    for path in config_files():
        name = config_name(path)
        bodies = [body for heading, body in found if f"`{name}`" in heading]
        if not bodies:
            missing.append(f"{name}: no section whose heading names `{name}`")
            continue
        missing.extend(
            f"{name}: {key}" for key in config_keys(path)
            if not any(mentions(body, key) for body in bodies)
        )
    return missing


def relative_links(markdown: str) -> list[str]:
    """Link targets that are paths in the repository (no scheme, no pure #anchor)."""
    targets = []
    in_fence = False
    for line in markdown.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for target in LINK.findall(line):
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
                continue
            targets.append(target.split("#", 1)[0])
    return targets


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines; at most {MAX_README_LINES}: move detail to docs/"
    )


def test_readme_links_point_to_files():
    targets = relative_links(README.read_text(encoding="utf-8"))
    assert targets, "README.md links into docs/: none found"
    broken = [t for t in targets if not (ROOT / t).exists()]
    assert not broken, f"README.md links to files that do not exist: {broken}"


def test_every_config_key_is_in_the_reference():
    assert config_files(), f"no config files under {CONFIGS}"
    missing = missing_keys(REFERENCE.read_text(encoding="utf-8"))
    assert not missing, (
        "docs/configuration.md does not list these config keys in their file's section:\n"
        + "\n".join(missing)
    )


def test_the_reference_check_can_fail():
    """Dropping one key's mention, or a whole section, from the reference is caught."""
    reference = REFERENCE.read_text(encoding="utf-8")
    assert "`trainer.compile`" in reference
    assert "trainer=default: trainer.compile" in missing_keys(
        reference.replace("`trainer.compile`", "compile"))
    without_section = reference.replace("## `serve.yaml`", "## The server")
    assert any(m.startswith("serve.yaml: no section") for m in missing_keys(without_section))


@pytest.mark.parametrize(("markdown", "expected"), [
    ("[a](docs/a.md) and ![b](docs/b.png \"title\")", ["docs/a.md", "docs/b.png"]),
    ("[web](https://example.org) [top](#top) [c](docs/c.md#part)", ["docs/c.md"]),
    ("```\n[not a link](nowhere.md)\n```", []),
])
def test_relative_links(markdown, expected):
    assert relative_links(markdown) == expected


def test_config_keys_walk_nested_nodes_and_packages():
    assert "trainer.valid.max_sentences" in config_keys(CONFIGS / "trainer" / "default.yaml")
    assert "model.attention.scorer._target_" in config_keys(
        CONFIGS / "model" / "attention" / "multihead.yaml")
    assert "trainer.average_last" in config_keys(CONFIGS / "experiment" / "multi30k_best.yaml")
    assert "batch.max_tokens" in config_keys(CONFIGS / "train.yaml")
    assert config_name(CONFIGS / "model" / "attention" / "additive.yaml") == (
        "model/attention=additive")


# A table row of the reference: | `key` | `default` | what |
ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*`([^`]*)`\s*\|", re.MULTILINE)


def differing_defaults(reference: str) -> list[str]:
    """`file: key: reference -> config` for every row of a file's section whose default is not
    the value the file gives (the one ``--help`` prints: seq2seq/cli/help.py reads it)."""
    from seq2seq.cli.help import group_prefix, parse_options

    found = sections(reference)
    differing = []
    for path in config_files():
        if config_name(path).startswith("experiment="):
            continue  # presets are overrides: their sections describe them in prose
        name = config_name(path)
        rows = {key: default for heading, body in found if f"`{name}`" in heading
                for key, default in ROW.findall(body)}
        for option in parse_options(path, group_prefix(path)):
            written = option.default.strip("'\"") or "{}"
            if option.key in rows and rows[option.key] != written:
                differing.append(f"{name}: {option.key}: {rows[option.key]} -> {written}")
    return differing


def test_the_reference_gives_the_defaults_help_gives():
    """docs/configuration.md and --help read the same files: a default changed in one place
    shows here."""
    assert differing_defaults(REFERENCE.read_text(encoding="utf-8")) == []


def test_the_defaults_check_can_fail():
    reference = REFERENCE.read_text(encoding="utf-8")
    row = "| `trainer.max_epochs` | `20` |"
    assert row in reference
    assert differing_defaults(reference.replace(row, "| `trainer.max_epochs` | `30` |")) == [
        "trainer=default: trainer.max_epochs: 30 -> 20"]
