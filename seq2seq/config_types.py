"""Check a config's values against the types the code expects, before anything is built.

A value typed on the command line (``optimizer.lr=abc``) would otherwise surface as a
traceback from deep inside a constructor. Here each node with a ``_target_`` is compared with
its target's signature, and each settings node with its dataclass, so the user gets one line
that names the key: ``optimizer.lr: expected a number, got 'abc'``.

Only scalars are judged (what YAML and the command line produce); an argument annotated with
a type this module does not know is accepted as it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import sys
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any


class ConfigError(ValueError):
    """A config value the code cannot use; the message names its key, on one line."""


ABSENT = object()  # what a plain config holds at a key it does not have


def value_at(config: Any, dotted: str, absent: Any = ABSENT) -> Any:
    """The value at the dotted key (``data.filter``) of a plain config, or ``absent``."""
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return absent
        node = node[part]
    return node


def config_differences(old: Any, new: Any, key: str = "",
                       absent: Any = ABSENT) -> list[tuple[str, Any, Any]]:
    """``(dotted key, old, new)`` of every leaf where two plain configs differ, in key order;
    a key one of them lacks holds ``absent`` there (None: a missing key equals a null one)."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = []
        for name in sorted(set(old) | set(new), key=str):
            found += config_differences(old.get(name, absent), new.get(name, absent),
                                        f"{key}.{name}" if key else str(name), absent)
        return found
    return [] if old == new else [(key, old, new)]


def error_reason(error: BaseException) -> str:
    """An error as one line that keeps its reason.

    Hydra's ``instantiate`` wraps what a constructor raised in an exception whose first line
    only names the target (``Error in call to target 'X':``); the reason is the wrapped
    exception, so that one is shown. Otherwise the message's first line, or the type's name.
    """
    while type(error).__name__ == "InstantiationException" and error.__cause__ is not None:
        error = error.__cause__
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


_NUMBERS = {int, float}
_NEVER_STRINGS = {int, float, bool, type(None)}


def _types_never_strings() -> set[Any]:
    """Types a string never is, with torch.Tensor once torch is loaded (an annotation that
    names it has loaded it); this module does not load torch itself, so that the entry points
    can refuse a bad option without it."""
    torch = sys.modules.get("torch")
    return (_NEVER_STRINGS | {torch.Tensor}) if torch is not None else _NEVER_STRINGS


def _members(annotation: Any) -> set[Any]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return set(typing.get_args(annotation))
    return {annotation}


def check_value(value: Any, annotation: Any, key: str) -> None:
    """Raise :class:`ConfigError` when scalar ``value`` cannot be what ``annotation`` admits."""
    if annotation is inspect.Parameter.empty or annotation is Any or value is None:
        return
    members = _members(annotation)
    if isinstance(value, str):
        if members <= _types_never_strings():
            wanted = ("true or false" if members - {type(None)} == {bool} else
                      "an integer" if float not in members and int in members else "a number")
            raise ConfigError(f"{key}: expected {wanted}, got {value!r}")
    elif isinstance(value, bool):
        if members <= {int, float, str, type(None)}:
            raise ConfigError(f"{key}: expected {_describe(members)}, got {value}")
    elif isinstance(value, (int, float)) and (members <= {str, bool, type(None)} or (
        isinstance(value, float) and members & _NUMBERS == {int} and members <= _types_never_strings()
    )):
        raise ConfigError(f"{key}: expected {_describe(members)}, got {value!r}")


def _describe(members: set[Any]) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    words = [names[m] for m in (str, float, int, bool) if m in members]
    return " or ".join(words[:2]) if words else "another type"


def locate_target(path: str) -> Any:
    """The class or function a ``_target_`` names, or ``None`` when it cannot be imported."""
    module_name, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        return None


def accepted_parameters(target) -> tuple[dict[str, inspect.Parameter], dict[str, Any], bool] | None:
    """What a class or function takes: its parameters, their type hints, and whether it takes
    any keyword beyond them; a class whose constructor passes ``**options`` on to its base's
    takes the base's too. None where the signature cannot be read."""
    try:
        parameters = dict(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return None
    functions = [target.__init__ if inspect.isclass(target) else target]
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    bases = target.__mro__[1:] if inspect.isclass(target) and "__init__" in vars(target) else ()
    for base in bases:
        if not takes_any or base is object:
            break
        if "__init__" not in vars(base):
            continue
        try:
            found = inspect.signature(base.__init__).parameters
        except (TypeError, ValueError):
            break
        functions.append(base.__init__)
        parameters = {name: p for name, p in found.items() if name != "self"} | parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in found.values())
    hints: dict[str, Any] = {}
    for function in reversed(functions):  # the subclass's hints win
        with contextlib.suppress(Exception):  # unresolvable: fall back to the defaults' types
            hints |= typing.get_type_hints(function)
    return parameters, hints, takes_any


def check_target_arguments(node: Mapping[str, Any], key: str) -> None:
    """Compare a ``_target_`` node's arguments with its target's signature.

    An argument the target does not take, or a scalar of the wrong type, is a
    :class:`ConfigError`. A target that cannot be imported is left to the instantiation,
    which reports it.
    """
    target = locate_target(str(node["_target_"]))
    if target is None:
        return
    accepted = accepted_parameters(target)
    if accepted is None:
        return
    parameters, hints, takes_any = accepted
    for name, value in node.items():
        if name.startswith("_"):
            continue
        parameter = parameters.get(name)
        if parameter is None:
            if not takes_any:
                raise ConfigError(f"{key}.{name}: {node['_target_']} takes no argument {name!r}")
            continue
        annotation = hints.get(name, parameter.annotation)
        if isinstance(annotation, str):
            default = parameter.default
            annotation = (type(default) if default not in (None, inspect.Parameter.empty)
                          else inspect.Parameter.empty)
        check_value(value, annotation, f"{key}.{name}")


def target_nodes(node: Any, key: str = "") -> Iterator[tuple[str, Mapping]]:
    """(dotted key, node) for every ``_target_`` node of a plain config (nested dicts and
    lists), each before the nodes inside it."""
    if isinstance(node, Mapping):
        if "_target_" in node:
            yield key, node
        for name, value in node.items():
            yield from target_nodes(value, f"{key}.{name}" if key else str(name))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from target_nodes(value, f"{key}[{index}]")


def check_config(config: Any, key: str = "") -> None:
    """Check every ``_target_`` node of a plain config (nested dicts and lists)."""
    for node_key, node in target_nodes(config, key):
        check_target_arguments(node, node_key)


def settings_from_dict(cls: type, values: Mapping[str, Any], key: str) -> Any:
    """Build dataclass ``cls`` (and its dataclass fields) from a config node, naming the key of
    any bad or unknown entry."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"{key}: expected a group of settings, got {values!r}")
    fields = {field.name: field for field in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"{key}: unknown settings {', '.join(unknown)}")
    hints = typing.get_type_hints(cls)
    built = {}
    for name, value in values.items():
        annotation = hints[name]
        if dataclasses.is_dataclass(annotation):
            built[name] = settings_from_dict(annotation, value, f"{key}.{name}")
            continue
        check_value(value, annotation, f"{key}.{name}")
        built[name] = value
    return cls(**built)
