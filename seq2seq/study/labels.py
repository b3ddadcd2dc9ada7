"""Group labels a reader can scan: only what tells the groups apart.

A group's *settings* name it in full, every differing choice and key
(``experiment=multi30k_luong_fast, model/attention=scaled_dot, model.attention.normalizer=sparsemax``);
its *label* keeps what tells it from the other groups (``scaled_dot + sparsemax``):

* a value more than half of the groups share (``softmax``, the RNN preset) is left out of their
  labels, and the report says it once above the table;
* so is a choice set to nothing (``model/attention=null``) and a key a group lacks;
* each is left out only if every label stays non-empty and unlike the others, so a label never
  loses what names its group (identical settings keep their full text); the experiment preset
  is left out first, then the keys set on top of a choice, then the other choices, so that
  what names a group (its scorer) is what stays;
* a name stands alone (``sparsemax``) unless another key has it too; a number or a flag keeps its
  key (``lr=0.001``); a prefix all the names of one key share, up to an underscore, is left out
  (``multi30k_`` of ``multi30k_transformer`` and ``multi30k_luong_fast``).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

MISSING = "-"  # shown for a key a run's config does not have
EXPERIMENT_CHOICE = "experiment/"  # the preset group, recorded like the other choices
JOIN = " + "
_NAME = re.compile(r"[A-Za-z_][\w.-]*")


def value_text(value: Any) -> str:
    """A value as an override spells it (``null``, ``true``); a ``_target_`` class path's class
    name."""
    if value is None:
        return "null"  # as Hydra spells it (model/attention=null: no scorer)
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    if "." in text and " " not in text and text.split(".")[0].isidentifier() and \
            text.rsplit(".", 1)[-1][:1].isupper():
        return text.rsplit(".", 1)[-1]  # a _target_ class path: its class name
    return text


def settings_text(values: Mapping[str, Any]) -> str:
    """A group's settings in full: ``model/attention=dot, model.attention.normalizer=softmax``
    (``all`` when nothing differs)."""
    return ", ".join(f"{k.rstrip('/')}={value_text(v)}" for k, v in values.items()) or "all"


def _nothing(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value == MISSING)


def _is_name(value: Any) -> bool:
    return isinstance(value, str) and bool(_NAME.fullmatch(value_text(value))) and \
        value.lower() not in ("true", "false", "null", "none")


def _shared_prefix(texts: set[str]) -> str:
    """The prefix, up to and with an underscore, that two or more names all share."""
    if len(texts) < 2:
        return ""
    prefix = os.path.commonprefix(sorted(texts))
    return prefix[:prefix.rfind("_") + 1]


def _part_texts(settings: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """For each key, each of its values' text in a label (by ``repr`` of the value)."""
    keys = list(dict.fromkeys(k for s in settings for k in s))
    values = {k: {repr(s[k]): s[k] for s in settings if k in s} for k in keys}
    names = {k: all(_is_name(v) for v in vs.values() if not _nothing(v))
             for k, vs in values.items()}
    stripped = {}
    for k, vs in values.items():
        texts = {value_text(v) for v in vs.values() if not _nothing(v)}
        prefix = _shared_prefix(texts) if names[k] else ""
        stripped[k] = {r: value_text(v)[len(prefix):] for r, v in vs.items() if not _nothing(v)}
    # A name that two keys share (encoder and decoder both `transformer`) would not say which.
    owners = Counter(t for k in keys if names[k] for t in set(stripped[k].values()))
    leaves = Counter(re.split(r"[/.]", k.rstrip("/"))[-1] for k in keys)
    texts: dict[str, dict[str, str]] = {}
    for k in keys:
        leaf = re.split(r"[/.]", k.rstrip("/"))[-1]
        name = leaf if leaves[leaf] == 1 else k.rstrip("/")
        bare = names[k] and all(owners[t] == 1 for t in stripped[k].values())
        texts[k] = {r: stripped[k][r] if bare and r in stripped[k] else f"{name}={value_text(v)}"
                    for r, v in values[k].items()}
    return texts


def short_labels(settings: Sequence[Mapping[str, Any]]) -> tuple[list[str], dict[str, Any]]:
    """Each group's short label, from its settings (differing key -> value, as in the full text).

    Returns:
        ``(labels, left_out)``: the labels, in the order of ``settings``, and the values left out
        of the labels because most groups share them (key -> value), which the report says once.
    """
    count = len(settings)
    full = [settings_text(s) for s in settings]
    if count < 2 or len(set(full)) < count:
        return full, {}
    texts = _part_texts(settings)

    def render(shown: list[dict[str, Any]]) -> list[str]:
        return [JOIN.join(texts[k][repr(v)] for k, v in s.items()) for s in shown]

    def fine(shown: list[dict[str, Any]]) -> bool:
        labels = render(shown)
        return all(labels) and len(set(labels)) == count

    keys = list(dict.fromkeys(k for s in settings for k in s))
    modes = {}
    for k in keys:
        tally = Counter(repr(s[k]) for s in settings if k in s and not _nothing(s[k]))
        if tally:
            modes[k] = tally.most_common(1)[0]
    def rank(key: str) -> tuple:
        """The preset is left out first (the context), then the keys set on top of a choice,
        then the other choices (what names a group); the most shared value first in each."""
        kind = 0 if key == EXPERIMENT_CHOICE else 1 if "/" not in key else 2
        return kind, -modes.get(key, ("", 0))[1], -keys.index(key)

    order = sorted(keys, key=rank)
    shown = [dict(s) for s in settings]
    left_out: dict[str, Any] = {}
    for k in order:
        mode, mode_count = modes.get(k, (None, 0))
        if 2 * mode_count > count:
            trial = [{key: v for key, v in s.items() if not (key == k and repr(v) == mode)}
                     for s in shown]
            if fine(trial):
                shown = trial
                left_out[k] = next(s[k] for s in settings if repr(s.get(k)) == mode)
        trial = [{key: v for key, v in s.items() if not (key == k and _nothing(v))}
                 for s in shown]
        if fine(trial):
            shown = trial
    return render(shown), left_out
