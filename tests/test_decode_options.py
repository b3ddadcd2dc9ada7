"""DecodeOptions: the one declaration of the decoding options, and what is derived from it."""

from __future__ import annotations

from dataclasses import asdict, fields

import pytest
from omegaconf import OmegaConf

from seq2seq import CONFIG_DIR
from seq2seq.inference.decode_options import DecodeOptions, described_options


@pytest.mark.parametrize(("values", "message"), [
    ({"beam_size": 0}, "beam_size must be at least 1, got 0"),
    ({"nbest": 0}, "nbest must be between 1 and beam_size (5), got 0"),
    ({"beam_size": 2, "nbest": 3}, "nbest must be between 1 and beam_size (2), got 3"),
    ({"length_penalty": -1.0}, "length_penalty must be a number >= 0, got -1.0"),
    ({"length_penalty": float("nan")}, "length_penalty must be a number >= 0, got nan"),
    ({"search": "sample", "seed": -1}, "seed must be in [0, 2**63), got -1"),
    ({"search": "sample", "seed": 2**63}, f"seed must be in [0, 2**63), got {2**63}"),
    ({"temperature": float("inf")}, "temperature must be a positive number, got inf"),
])
def test_a_value_out_of_range_is_refused_where_it_is_made_naming_the_option(values, message):
    with pytest.raises(ValueError) as info:
        DecodeOptions(**values)
    assert str(info.value) == message


def test_the_largest_seed_is_a_seed():
    assert DecodeOptions(search="sample", seed=2**63 - 1).seeded


def test_every_option_is_described_once_in_its_declaration():
    described = described_options()
    assert list(described) == [option.name for option in fields(DecodeOptions)]
    for name, (_, default, meaning) in described.items():
        assert default == getattr(DecodeOptions(), name)
        assert meaning and "\n" not in meaning, name
    assert described["seed"][0] == int | None


@pytest.mark.parametrize("tool", ["translate", "evaluate", "serve"])
def test_every_decoding_tool_gets_decode_options_defaults_from_the_decoding_group(tool):
    """The tools' configs include the decoding group, whose options are made from
    DecodeOptions: no YAML file restates one, so none can drift from the declaration."""
    from seq2seq.cli.common import compose

    cfg = compose(tool)
    assert {name: cfg[name] for name in described_options()} == asdict(DecodeOptions())
    assert cfg.hydra.runtime.choices["decoding"] == "default"
    for path in (CONFIG_DIR / f"{tool}.yaml", CONFIG_DIR / "decoding" / "default.yaml"):
        assert not set(described_options()) & set(OmegaConf.load(path)), path


def test_the_decoding_group_is_where_an_option_is_changed():
    from seq2seq.cli.common import compose

    cfg = compose("serve", ["search=sample", "top_p=0.9", "nbest=2"])
    assert DecodeOptions.of(cfg) == DecodeOptions(search="sample", top_p=0.9, nbest=2)


def test_help_describes_a_decoding_option_with_its_declaration():
    from seq2seq.cli.help import render_help

    text = " ".join(render_help("evaluate", "python evaluate.py", width=400).split())
    top_p = described_options()["top_p"][2]
    assert f"top_p {top_p} [default 1.0]" in text
