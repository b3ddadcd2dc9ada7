"""What every Hydra entry point does before and around Hydra: ``--help`` from the tool's own
config, sentences typed as a shell user types them, and a command line Hydra cannot compose
as one line with the nearest valid keys instead of Hydra's message of six.

Each entry point's ``main()`` is made (or, for ``train.py``, wrapped) by :func:`hydra_tool`
from its ``run(cfg)``: a ``@hydra.main`` function run by :func:`run_hydra_app`. The command
line's config is composed first with Hydra's compose API, which raises what it cannot compose
as an exception: the one line is made from that exception's structure
(:func:`explain_composition_error`).
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from seq2seq import CONFIG_DIR
from seq2seq.cli.common import (
    check_group_overrides,
    compose,
    compose_config,
    config_leaves,
    fail,
    without_sweeps,
)
from seq2seq.config_types import error_reason


def quote_literal(value: str) -> str:
    """``value`` as a Hydra quoted string that composes back to exactly ``value`` (commas,
    quotes, ``=``, brackets, non-ASCII letters and ``${`` included)."""
    escaped = re.sub(r"(\\+)(?='|$|\$\{)", lambda match: match[1] * 2, value)
    return "'" + escaped.replace("'", "\\'").replace("${", "\\${") + "'"


def literal_overrides(argv: Sequence[str], keys: Iterable[str]) -> list[str]:
    """``key=VALUE`` arguments for ``keys`` taken as plain text.

    The shell hands ``text="Zwei Männer, ein Hund."`` to the program as
    ``text=Zwei Männer, ein Hund.``, which Hydra's grammar refuses (non-ASCII letters) or reads
    as a sweep (the comma). A value already in Hydra's quoted form (``'text="a, b"'``) is left
    as it is, so a sentence that is wholly in one pair of quotes loses them (as it always has).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    keys = set(keys)
    parser = OverridesParser.create()
    rewritten = []
    for argument in argv:
        key, equals, value = argument.partition("=")
        if equals and key in keys:
            quoted = len(value) > 1 and value[0] == value[-1] and value[0] in "'\""
            try:
                kept = quoted and isinstance(parser.parse_override(argument).value(), str)
            except Exception:  # the grammar refuses it: it is text all the same
                kept = False
            if not kept:
                argument = f"{key}={quote_literal(value)}"
        rewritten.append(argument)
    return rewritten


def parse_command_line(argv: Sequence[str]):
    """Hydra's own reading of the command line: its flags (``--cfg``, ``-m``, ``--help``, shell
    completion) and the overrides, as its entry point will see them."""
    # Hydra 1.3 has no public parser of its command line: its own, the one place we import
    # from hydra._internal.
    from hydra._internal.utils import get_args_parser

    return get_args_parser().parse_known_args(list(argv))[0]


def config_keys(node: Any, prefix: str = "") -> list[str]:
    """Every key of a plain config as a dotted path, the nodes that hold others included."""
    keys = []
    if isinstance(node, dict):
        for name, value in node.items():
            path = f"{prefix}{name}"
            keys.append(path)
            keys += config_keys(value, f"{path}.")
    return keys


@functools.cache
def _file_node(config_name: str) -> dict:
    """A primary config as its file and the groups it includes set it (no ``hydra``), as
    written (``???`` and interpolations unresolved)."""
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(compose(config_name), resolve=False)
    plain.pop("hydra", None)
    return plain


def file_keys(config_name: str) -> list[str]:
    """The keys a tool's config declares: its file's and those of the groups it includes (the
    decoding group's), not ``hydra``."""
    return config_keys(_file_node(config_name))


def did_you_mean(key: str, candidates: Iterable[str]) -> str:
    """`` (did you mean a or b?)`` for the candidates nearest ``key``, or nothing."""
    candidates = sorted(set(candidates))
    # A mistyped last part first, among the keys beside it; then the whole dotted path.
    parent, _, last = key.rpartition(".")
    siblings = {c.rpartition(".")[2]: c for c in candidates if c.rpartition(".")[0] == parent}
    close = [siblings[name] for name in difflib.get_close_matches(last, list(siblings), n=2,
                                                                  cutoff=0.7)]
    parents = {c.rpartition(".")[0] for c in candidates}
    if not close and parent not in parents:  # a mistyped parent: the whole dotted path
        close = difflib.get_close_matches(key, candidates, n=2, cutoff=0.7)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def refuse_unknown_keys(argv: Sequence[str], config_name: str) -> None:
    """Exit with one line for a ``key=value`` (``+key``/``++key`` too) that the tool's config
    does not declare: a tool that is not ``train.py`` takes no key its code would not read."""
    known = file_keys(config_name)
    # Top-level nodes declared empty (``data: {}``): any key below them is the user's.
    open_nodes = tuple(f"{key}." for key, value in _file_node(config_name).items() if value == {})
    for argument in parse_command_line(argv).overrides:
        key, equals, _ = argument.lstrip("+").partition("=")
        if not equals or key.startswith(("hydra.", "hydra/", "~")) or key in known \
                or key.startswith(open_nodes):
            continue
        leaves = [leaf for leaf, _ in config_leaves(_file_node(config_name))]
        fail(f"{key} is not an option of {config_name}.yaml{did_you_mean(key, leaves)}; "
             "--help lists them")


def _unknown_key_message(key: str, config_name: str, overrides: Sequence[str]) -> str:
    """``KEY is not an option (did you mean ...?)``, with the ``+`` form where the key would go
    under a node that takes keys of its own (a ``_target_`` class's, an open ``{}`` node)."""
    from omegaconf import OmegaConf

    rest = [o for o in overrides if o.lstrip("+").partition("=")[0] != key]
    cfg = compose_config(config_name, rest)
    if cfg is None:
        leaves, parent_node = file_keys(config_name), None
    else:
        plain = OmegaConf.to_container(cfg, resolve=False)
        plain.pop("hydra", None)
        leaves = [leaf for leaf, _ in config_leaves(plain)]
        parent = key.rpartition(".")[0]
        parent_node = OmegaConf.select(cfg, parent) if parent else None
    hint = did_you_mean(key, leaves)
    takes_own = OmegaConf.is_dict(parent_node) and ("_target_" in parent_node or not parent_node)
    plus = f", or add it with +{key}=VALUE if your class takes it" if takes_own else ""
    return f"{key} is not an option{hint}{plus}; --help lists them"


def explain_composition_error(error: Exception, config_name: str,
                              overrides: Sequence[str]) -> str:
    """One line for an error Hydra raised while composing ``overrides``, read from the
    exception: the key an override could not set (its cause's ``full_key``), the group option
    that is not there (``missing_cfg_file``, ``options``), the override its grammar refused.
    What Hydra 1.3 says in words only goes to :func:`_reason_in_words`."""
    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    cause = error.__cause__
    if isinstance(cause, ConfigAttributeError | ConfigKeyError) and cause.full_key:
        return _unknown_key_message(cause.full_key, config_name, overrides)
    if isinstance(cause, OmegaConfBaseException) and cause.full_key:
        return f"{cause.full_key}: {error_reason(cause)}"
    if isinstance(error, MissingConfigException) and error.options:
        group, _, option = error.missing_cfg_file.rpartition("/")
        return (f"{group}={option}: no such choice{did_you_mean(option, error.options)}; "
                f"choose one of {', '.join(error.options)}")
    if isinstance(error, OverrideParseException):
        first = error.message.strip().splitlines()[0]
        return (f"cannot read the command line ({first}); quote a value that holds spaces, "
                "commas, quotes or non-ASCII letters: 'key=\"...\"'")
    return _reason_in_words(error, config_name, overrides)


def _reason_in_words(error: Exception, config_name: str, overrides: Sequence[str]) -> str:
    """One line for the composition errors Hydra 1.3 raises as a bare
    ``ConfigCompositionException`` whose message is all it says: a value with a comma outside
    a sweep, and an override of the defaults list that matches no entry or sets a group twice.
    tests/test_cli_app.py holds these against the pinned Hydra's words."""
    text = str(error)
    if match := re.match(r"Ambiguous value for argument '([^']+)'", text):
        key = match[1].partition("=")[0]
        return (f"{match[1]}: a value with a comma is a list or a sweep to Hydra; quote it "
                f"('{key}=\"a, b\"') or give a list ({key}=[a,b])")
    if match := re.match(r"Could not override '([^']+)'\. No match in the defaults list", text):
        return _unknown_key_message(match[1], config_name, overrides)
    if match := re.match(r"Multiple values for ([^.]+)\. To override a value use "
                         r"'override \S+: (.*)'", text):
        return (f"+{match[1]}={match[2]}: {match[1]} has a choice already; give it as "
                f"{match[1]}={match[2]} (without +)")
    return error_reason(error)


def refuse_what_cannot_compose(config_name: str, argv: Sequence[str]) -> None:
    """Exit with one line when Hydra cannot compose the config of the command line ``argv``
    (of a multirun: its overrides without the sweeps, which one config cannot take).

    Left to Hydra's own report: a command line that names other configs (``--config-name``,
    ``--config-path``, ``--config-dir``) and a user who set ``HYDRA_FULL_ERROR=1``.
    """
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    parsed = parse_command_line(argv)
    if (parsed.config_name or parsed.config_path or parsed.config_dir
            or os.environ.get("HYDRA_FULL_ERROR") == "1"):
        return
    overrides = parsed.overrides
    try:
        compose(config_name, without_sweeps(overrides) if parsed.multirun else overrides)
    except (HydraException, OmegaConfBaseException) as error:
        fail(explain_composition_error(error, config_name, overrides))


def run_hydra_app(app: Callable[[], Any], *, config_name: str, command: str, summary: str,
                  strict: bool, literal_keys: Sequence[str] = (),
                  argv: Sequence[str] | None = None) -> Any:
    """Run ``app`` (a ``@hydra.main`` function) on the command line ``argv`` (None:
    ``sys.argv``'s) as described in the module docstring. ``strict``: refuse any key the tool's
    config file does not declare; ``literal_keys``: keys whose values are text as the shell
    handed it over (:func:`literal_overrides`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parsed = parse_command_line(argv)
    if not parsed.shell_completion:  # that is Hydra's own business
        if parsed.help:
            from seq2seq.cli.help import render_help

            print(render_help(config_name, command, parsed.overrides, summary=summary), end="")
            sys.exit(0)
        check_group_overrides(parsed.overrides)
        if strict:
            refuse_unknown_keys(argv, config_name)
        if literal_keys:
            argv = literal_overrides(argv, literal_keys)
        refuse_what_cannot_compose(config_name, argv)
    # @hydra.main reads its command line from sys.argv only: ``argv`` goes there for the run,
    # the caller's comes back after.
    given = sys.argv[1:]
    sys.argv[1:] = argv
    try:
        return app()
    finally:
        sys.argv[1:] = given


def hydra_tool(run: Callable[[Any], Any], *, config_name: str, summary: str, strict: bool = True,
               literal_keys: Sequence[str] = (), bare: str | None = None,
               old_flags: dict[str, str] | None = None, lists: Sequence[str] = (),
               bare_is_old: bool = False) -> Callable[..., Any]:
    """A tool's ``main(argv=None)``: ``run`` on the config Hydra composes from ``config_name``
    and the command line (``argv``, else ``sys.argv``), after :func:`run_hydra_app`'s ``--help``
    and checks (``strict``, ``literal_keys``: as there). ``bare``, ``old_flags``, ``lists``,
    ``bare_is_old``: the bare arguments and the previous release's flags, read as
    :func:`flags_as_overrides` says. ``run``'s result is what a Hydra sweeper reads."""
    import hydra

    def main(argv: Sequence[str] | None = None) -> Any:
        argv = flags_as_overrides(sys.argv[1:] if argv is None else argv, old_flags or {},
                                  bare=bare, lists=lists, bare_is_old=bare_is_old)
        return run_hydra_app(main.task, config_name=config_name, argv=argv,
                             command=script_command(sys.argv[0]), summary=summary,
                             strict=strict, literal_keys=literal_keys)

    # The @hydra.main function run_hydra_app runs (an attribute: a test may replace it).
    main.task = hydra.main(version_base="1.3", config_path=str(CONFIG_DIR),
                           config_name=config_name)(run)
    main.__doc__ = summary
    return main


# Hydra's own flags that take a value: the word after one is no positional argument.
_HYDRA_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--info", "-i", "--config-path", "-cp",
                      "--config-name", "-cn", "--config-dir", "-cd", "--shell-completion", "-sc",
                      "--experimental-rerun"}


def bare_as_list(argv: Sequence[str], key: str) -> list[str]:
    """``A B k=v`` as ``key=['A','B'] k=v`` (one: ``key='A'``): the bare arguments of a tool
    that takes them (compare.py's run folders), each quoted so that a glob or a comma stays
    itself; the word after a Hydra flag that takes one (``--cfg job``) is not bare."""
    overrides, values, previous = [], [], ""
    for argument in argv:
        if "=" not in argument and not argument.startswith("-") \
                and previous not in _HYDRA_VALUE_FLAGS:
            values.append(argument)
        else:
            overrides.append(argument)
        previous = argument
    quoted = [quote_literal(value) for value in values]
    if len(quoted) == 1:
        overrides.insert(0, f"{key}={quoted[0]}")
    elif quoted:
        overrides.insert(0, f"{key}=[{','.join(quoted)}]")
    return overrides


def flags_as_overrides(argv: Sequence[str], flags: dict[str, str], *, bare: str | None,
                       lists: Sequence[str] = (), bare_is_old: bool = False) -> list[str]:
    """A command line in a tool's previous, argparse form (``A B --beam-sizes 1,3``) as the
    ``key=value`` overrides every tool takes now (``checkpoint=[A,B] beam_sizes=[1,3]``), with
    a warning on stderr where the old form was used; today's form comes back as it is.

    Args:
        flags: each old flag (``--beam-sizes``) and the key it sets.
        bare: the key the bare arguments set (:func:`bare_as_list`), if the tool takes any.
        lists: the keys whose comma-separated values are a list.
        bare_is_old: whether bare arguments are the old form too (else today's, as in
            compare.py's run folders).
    """
    overrides, old = [], False
    arguments = iter(argv)
    for argument in arguments:
        if argument in flags:
            key, value, old = flags[argument], next(arguments, ""), True
            overrides.append(f"{key}=[{value}]" if key in lists else f"{key}={value}")
        else:
            overrides.append(argument)
    if bare is not None:
        given, overrides = overrides, bare_as_list(overrides, bare)
        old = old or (bare_is_old and overrides != given)
    if old:
        print(f"warning: --flags and bare paths are the previous release's form, read this once "
              f"more; write key=value: {' '.join(overrides)}", file=sys.stderr, flush=True)
    return overrides


def script_command(path: str | Path) -> str:
    """How the user started the tool, for its usage line (``python translate.py``)."""
    name = Path(path).name
    return f"python {name}" if name.endswith(".py") else name
