"""What every entry point does around Hydra (seq2seq/cli/app.py, seq2seq/cli/help.py): text as a
shell user types it, unknown and mistyped keys in one line with the nearest valid ones, errors
that keep their reason, and ``--help`` made of the tool's own options."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from conftest import api_lines, compose_train_config
from omegaconf import OmegaConf

from seq2seq import CONFIG_DIR
from seq2seq.cli.app import (
    did_you_mean,
    explain_composition_error,
    file_keys,
    literal_overrides,
    quote_literal,
    run_hydra_app,
)
from seq2seq.cli.common import compose
from seq2seq.cli.help import group_prefix, parse_options, render_help
from seq2seq.config_types import ConfigError
from seq2seq.inference.decode_options import described_options as declared_options
from seq2seq.models.build import check_model_config

# The decoding options: described where DecodeOptions declares them, not in the YAML files.
DECODE_OPTIONS = declared_options()

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}

# What a shell hands the program for text="..." (the shell has removed the outer quotes).
SENTENCES = [
    "Zwei Männer, ein Hund.",
    "Ein Hund, eine Katze.",
    'Er sagt: "Hallo" und \'tschüss\'.',
    "Die Straße ist groß, sagt's.",
    "a=b [x] {y} (z)",
    "- ein Spiegelstrich",
    "--help ist kein Schalter hier",
    "Preis: ${oc.env:HOME} $x",
    "back\\slash am Ende\\",
    "a\\${b}",
    "a \\\\${b}",
    "null",
    "42",
]


@pytest.mark.parametrize("sentence", SENTENCES)
def test_text_composes_to_exactly_what_the_shell_handed_over(sentence):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = literal_overrides(["checkpoint=x.pt", f"text={sentence}"], ["text"])
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="translate", overrides=overrides)
    assert cfg.text == sentence
    assert quote_literal(sentence).startswith("'")


def test_the_quoted_form_keeps_working():
    # 'text="Zwei Hunde, ein Ball."' (the older README form): Hydra removes the inner quotes.
    assert literal_overrides(['text="Zwei Hunde, ein Ball."'], ["text"]) == [
        'text="Zwei Hunde, ein Ball."']


def test_translate_py_translates_a_typed_sentence_and_refuses_bad_utf8_on_stdin(
        run_tool, trained_checkpoint, tmp_path):
    sentence = "Zwei Männer, ein Hund: \"ja\" = [gut]."
    result = run_tool([ROOT / "translate.py", f"checkpoint={trained_checkpoint}",
                       f"text={sentence}", "beam_size=2"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == api_lines(trained_checkpoint, [sentence], beam_size=2)

    broken = run_tool([ROOT / "translate.py", f"checkpoint={trained_checkpoint}"], cwd=tmp_path,
                      stdin=b"ein satz\nzwei \xff\xfe s\xc3\n")
    assert broken.returncode == 1
    assert broken.stderr.strip().splitlines()[-1] == (
        "error: <stdin>: line 2 is not valid UTF-8 (byte 0xff at column 6)")


@pytest.mark.parametrize(("tool", "argument", "message"), [
    ("translate.py", "+beem_size=3", "beem_size is not an option of translate.yaml "
                                     "(did you mean beam_size?); --help lists them"),
    ("translate.py", "beem_size=3", "beem_size is not an option of translate.yaml "
                                    "(did you mean beam_size?); --help lists them"),
    ("evaluate.py", "++splt=valid", "splt is not an option of evaluate.yaml "
                                    "(did you mean split?); --help lists them"),
    ("export.py", "+model/attention=dot", "model/attention is not an option of export.yaml; "
                                          "--help lists them"),
    ("serve.py", "+prot=80", "prot is not an option of serve.yaml (did you mean port?); "
                             "--help lists them"),
    ("train.py", "trainer.max_step=30", "trainer.max_step is not an option (did you mean "
                                        "trainer.max_steps or trainer.max_time?); --help lists them"),
    ("train.py", "model/attention=dott", "model/attention=dott: no such choice (did you mean "
                                         "dot?); choose one of additive, dot, gaussian, general, "
                                         "location, multihead, scaled_dot"),
])
def test_unknown_or_mistyped_keys_are_one_line_with_the_nearest(run_tool, tmp_path, tool,
                                                                 argument, message):
    result = run_tool([ROOT / tool, "checkpoint=x.pt", argument] if tool != "train.py"
                      else [ROOT / tool, argument], cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [f"error: {message}"]
    assert not (tmp_path / "outputs").exists()


def test_evaluate_keeps_its_open_data_node():
    # +data.dir=... overrides the checkpoint's stored data config: not an unknown key.
    assert "data" in file_keys("evaluate")
    from seq2seq.cli.app import refuse_unknown_keys

    refuse_unknown_keys(["checkpoint=x", "+data.dir=/data"], "evaluate")  # no exit


def test_did_you_mean_compares_the_last_part_with_its_siblings():
    keys = ["trainer.max_steps", "trainer.seed", "model.dropout"]
    assert did_you_mean("trainer.maxsteps", keys) == " (did you mean trainer.max_steps?)"
    assert did_you_mean("something.else", keys) == ""


@pytest.mark.parametrize(("overrides", "message"), [
    (["model/attention=dot", "model.decoder.hidden_size=256"],
     "model.attention: DotScorer takes the dot product of query and key, but query_dim=256 != "
     "key_dim=512. Set model.attention.project_keys=true"),
    (["model/attention=multihead", "model.attention.heads=3"],
     "model.attention: MultiHeadScorer splits the values into one slice per head, so "
     "key_dim=512 must be divisible by heads=3"),
    (["model.decoder.hidden_size=0"], "model.decoder.hidden_size must be a positive integer, got 0"),
    (["experiment=multi30k_transformer", "model.decoder.num_heads=3"],
     "model.decoder: d_model (256) must be divisible by num_heads (3)"),
])
def test_model_settings_that_cannot_work_are_refused_with_their_reason(overrides, message):
    config = OmegaConf.to_container(compose_train_config(overrides), resolve=True)
    with pytest.raises(ConfigError) as refused:
        check_model_config(config["model"])
    assert str(refused.value).startswith(message)
    assert "\n" not in str(refused.value)


def test_train_py_prints_the_reason_before_the_data_stage(run_tool, tmp_path):
    result = run_tool([ROOT / "train.py", "model/attention=dot", "model.decoder.hidden_size=256",
                       f"hydra.run.dir={tmp_path / 'run'}", f"paths.data_dir={tmp_path / 'data'}"],
                      cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: model.attention: DotScorer takes the dot product of query and key, but "
        "query_dim=256 != key_dim=512. Set model.attention.project_keys=true to learn a key "
        "projection, or choose another scorer (e.g. model/attention=general or additive)."]
    assert not (tmp_path / "data").exists()
    assert not (tmp_path / "run").exists()  # refused before the folder was claimed


class ItemEncoder:
    """A user's part whose constructor reads a tensor's value: it cannot be built on the meta
    device, so the early check leaves it to the real build."""

    def __new__(cls, **arguments):
        import torch

        from seq2seq.models.encoder import RNNEncoder

        torch.ones(1).sum().item()
        return RNNEncoder(**arguments)


def test_a_part_that_cannot_be_built_on_meta_is_left_to_the_real_build():
    config = OmegaConf.to_container(compose_train_config([]), resolve=True)
    config["model"]["encoder"]["_target_"] = f"{__name__}.ItemEncoder"
    check_model_config(config["model"])  # no error


@pytest.mark.parametrize(("tool", "arguments", "message"), [
    # A sweep elsewhere on the line does not cost the suggestion.
    ("train.py", ["-m", "trainer.seed=1,2", "trainer.max_step=30"],
     "trainer.max_step is not an option (did you mean trainer.max_steps or trainer.max_time?); "
     "--help lists them"),
    # Under a node that takes keys of its own, the + form is named.
    ("evaluate.py", ["checkpoint=x.pt", "data.dir=/data"],
     "data.dir is not an option, or add it with +data.dir=VALUE if your class takes it; "
     "--help lists them"),
    ("train.py", ["model.encoder.foo=3"],
     "model.encoder.foo is not an option, or add it with +model.encoder.foo=VALUE if your class "
     "takes it; --help lists them"),
])
def test_what_the_message_of_an_unknown_key_says(run_tool, tmp_path, tool, arguments, message):
    result = run_tool([ROOT / tool, *arguments], cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [f"error: {message}"]


@pytest.mark.parametrize(("overrides", "message"), [
    # Read from the exception's structure.
    (["trainer.max_step=30"], "trainer.max_step is not an option (did you mean trainer.max_steps "
                              "or trainer.max_time?); --help lists them"),
    (["model/decoder=luongg"], "model/decoder=luongg: no such choice (did you mean luong?); "
                               "choose one of bahdanau, luong, transformer"),
    (["trainer.seed='a"], "cannot read the command line (LexerNoViableAltException: "
                          "trainer.seed='a); quote a value that holds spaces, commas, quotes or "
                          "non-ASCII letters: 'key=\"...\"'"),
    (["trainer.valid=[1]"], "trainer.valid: Cannot merge DictConfig with ListConfig"),
    # What Hydra 1.3 says in words only: these fail when a Hydra release words it otherwise.
    (["trainer.seed=1,2"], "trainer.seed=1,2: a value with a comma is a list or a sweep to Hydra; "
                           "quote it ('trainer.seed=\"a, b\"') or give a list (trainer.seed=[a,b])"),
    (["model=x"], "model is not an option; --help lists them"),
    (["+model/attention=dot"], "+model/attention=dot: model/attention has a choice already; give "
                               "it as model/attention=dot (without +)"),
])
def test_a_composition_error_of_the_pinned_hydra_is_one_line(overrides, message):
    with pytest.raises(Exception) as raised:
        compose("train", overrides)
    assert explain_composition_error(raised.value, "train", overrides) == message


def test_hydra_runs_with_the_users_environment_and_the_quoted_text(monkeypatch):
    """The command line is composed once before Hydra runs: Hydra's own environment is left as
    the user set it, and sys.argv holds the quoted text only while the app runs."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    given = ["translate.py", "checkpoint=x.pt", "text=Zwei Männer, ein Hund."]
    monkeypatch.setattr(sys, "argv", list(given))
    seen = []
    run_hydra_app(lambda: seen.append((os.environ.get("HYDRA_FULL_ERROR"), list(sys.argv))),
                  config_name="translate", command="translate.py", summary="", strict=True,
                  literal_keys=["text"])
    assert seen == [(None, ["translate.py", "checkpoint=x.pt", "text='Zwei Männer, ein Hund.'"])]
    assert sys.argv == given


def test_an_error_composing_stops_before_hydra(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["train.py", "trainer.seed=1,2"])
    with pytest.raises(SystemExit) as raised:
        run_hydra_app(lambda: pytest.fail("Hydra was reached"), config_name="train",
                      command="train.py", summary="", strict=False)
    assert raised.value.code == 1
    assert capsys.readouterr().err.startswith("error: trainer.seed=1,2: a value with a comma")


def test_hydras_own_flags_pass(run_tool, tmp_path):
    result = run_tool([ROOT / "translate.py", "-sc", "install=bash"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr


# -- --help ---------------------------------------------------------------------------------
def described_options(config_name: str, choices: dict[str, str] | None = None) -> list[str]:
    paths = [CONFIG_DIR / f"{config_name}.yaml"]
    paths += [CONFIG_DIR / group / f"{option}.yaml" for group, option in (choices or {}).items()]
    return [option.key for path in paths for option in parse_options(path, group_prefix(path))
            if option.description]


@pytest.mark.parametrize("config_name", ["translate", "evaluate", "export", "serve",
                                         "tune_decoding", "compare"])
def test_help_lists_the_tools_options_each_with_a_description(config_name):
    text = render_help(config_name, f"python {config_name}.py", width=100)
    listed = re.findall(r"^  (\S+)", text.split("Options (key=value):")[1], re.MULTILINE)
    composed = compose(config_name)
    leaves = [key for key in file_keys(config_name)
              if not OmegaConf.is_dict(OmegaConf.select(composed, key))
              or not OmegaConf.select(composed, key)]
    assert sorted(listed) == sorted(leaves)
    for training_group in ("model/attention", "optimizer", "trainer."):
        assert training_group not in text
    decoding = {"decoding": "default"} if config_name != "export" else {}
    described = set(described_options(config_name, decoding))
    flat = " ".join(text.split())
    for key in listed:
        if key not in described:  # a decoding option, described where it is declared
            assert key in DECODE_OPTIONS, f"{config_name}: {key}: no description"
            assert " ".join(DECODE_OPTIONS[key][2].split()) in flat, key


def test_every_option_of_every_config_has_a_description():
    missing = [f"{path.relative_to(CONFIG_DIR)}: {option.key}"
               for path in sorted(CONFIG_DIR.rglob("*.yaml"))
               if not str(path.relative_to(CONFIG_DIR)).startswith(("hydra/", "experiment/"))
               for option in parse_options(path, group_prefix(path))
               if not option.description and option.key not in DECODE_OPTIONS]
    assert missing == []


def test_train_help_follows_the_chosen_groups():
    text = render_help("train", "python train.py", ["model/attention=multihead"], width=100)
    assert "model.attention.heads" in text and "trainer.max_steps" in text
    assert re.search(r"^  model/attention +multihead \| additive", text, re.MULTILINE)
    assert "model.attention.hidden_size" not in text  # additive's, not chosen


def test_train_help_with_a_preset_shows_what_that_run_would_get():
    text = render_help("train", "python train.py", ["experiment=multi30k_best"], width=200)
    listed = re.findall(r"^  (\S+) +(.*)$", text, re.MULTILINE)
    keys = [key for key, _ in listed]
    assert len(keys) == len(set(keys))  # each option once
    lines = dict(listed)
    assert lines["model.dropout"].endswith("[default 0.3]")
    assert lines["optimizer.weight_decay"].endswith("[default 0.1]")  # adamw, as the preset says
    assert lines["scheduler"].startswith("cosine")  # the group's chosen option first
    assert "min_factor" in text


def test_help_from_the_command_line(run_tool, tmp_path):
    result = run_tool([ROOT / "translate.py", "--help"], cwd=tmp_path)
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("usage: python translate.py [key=value ...]")
    assert re.search(r"^  beam_size +beams per sentence; 1: greedy search \[default 5\]$",
                     result.stdout, re.MULTILINE)
