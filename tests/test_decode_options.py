"""DecodeOptions: the one declaration of the decoding options, and what is derived from it."""

from __future__ import annotations

from dataclasses import fields

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
def test_the_tools_configs_start_from_decode_options_defaults(tool):
    """A tool's YAML sets the decoding options it shows to DecodeOptions' defaults: the two
    cannot drift apart unnoticed."""
    config = OmegaConf.load(CONFIG_DIR / f"{tool}.yaml")
    shared = [name for name in described_options() if name in config]
    assert {"beam_size", "length_penalty", "max_len_a", "max_len_b"} <= set(shared)
    assert {name: config[name] for name in shared} == {
        name: getattr(DecodeOptions(), name) for name in shared}


def test_help_describes_a_decoding_option_with_its_declaration():
    from seq2seq.cli.help import render_help

    text = " ".join(render_help("evaluate", "python evaluate.py", width=400).split())
    top_p = described_options()["top_p"][2]
    assert f"top_p {top_p} [default 1.0]" in text
    # A tool's own words win where its file has them: translate.py's nbest names its output.
    text = " ".join(render_help("translate", "python translate.py", width=400).split())
    assert 'N lines "SCORE<TAB>TRANSLATION" each' in text
