"""Checkpoints are read weights-only: crafted pickles are refused, broken files explained, and
the classes a checkpoint's config names are instantiated only from trusted modules."""

from __future__ import annotations

import functools
import os
import pathlib
import sys
from pathlib import Path

import pytest
import torch
from conftest import api_lines

from seq2seq.checkpoint import (
    CheckpointError,
    check_targets,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
)
from seq2seq.inference.decode_options import DecodeOptions
from seq2seq.inference.runtimes import load_translator

ROOT = Path(__file__).resolve().parents[1]


class TouchOnLoad:
    """Unpickling this calls ``Path.touch(marker)``: any code could run in its place."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def malicious_checkpoint(path: Path, marker: Path) -> Path:
    torch.save({"format_version": 1, "model": {}, "payload": TouchOnLoad(marker)}, path)
    return path


def truncated_checkpoint(path: Path, source: Path) -> Path:
    data = source.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def random_bytes_file(path: Path) -> Path:
    path.write_bytes(
        torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0))
        .to(torch.uint8)
        .numpy()
        .tobytes()
    )
    return path


def test_pickled_code_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = malicious_checkpoint(tmp_path / "evil.pt", marker)
    with pytest.raises(CheckpointError, match="refusing to load .* could run code"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="refusing to load"):
        load_translator(path)
    assert not marker.exists()
    # The file really is dangerous: an unsafe load runs the payload.
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_truncated_file_gets_a_clear_message(tmp_path, make_checkpoint):
    path = truncated_checkpoint(tmp_path / "truncated.pt", make_checkpoint(tmp_path / "model"))
    with pytest.raises(CheckpointError, match="truncated or corrupted") as caught:
        load_checkpoint(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_random_bytes_are_refused_with_a_one_line_message(tmp_path):
    path = random_bytes_file(tmp_path / "random.pt")
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_random_bytes_are_reported_as_corrupted(tmp_path):
    path = random_bytes_file(tmp_path / "random.pt")
    with pytest.raises(CheckpointError, match="truncated or corrupted"):
        load_checkpoint(path)


@pytest.mark.parametrize("kind", ["pickle", "truncated", "random", "unknown_name"])
def test_command_line_refuses_bad_checkpoints_without_traceback(tmp_path, kind, make_checkpoint,
                                                               run_python):
    marker = tmp_path / "pwned"
    if kind == "pickle":
        path = malicious_checkpoint(tmp_path / "bad.pt", marker)
        expected = "refusing to load"
    elif kind == "truncated":
        path = truncated_checkpoint(tmp_path / "bad.pt", make_checkpoint(tmp_path / "model"))
        expected = "truncated or corrupted"
    elif kind == "unknown_name":  # a registry name no entry has
        checkpoint = load_checkpoint(make_checkpoint(tmp_path / "model"))
        checkpoint["config"]["model"]["attention"]["_target_"] = "addittive"
        path = tmp_path / "bad.pt"
        save_checkpoint(checkpoint, path)
        expected = "'addittive', which is neither a built-in part"
    else:
        path = random_bytes_file(tmp_path / "bad.pt")
        expected = str(path)
    tool = "translate.py" if kind != "truncated" else "evaluate.py"
    result = run_python([ROOT / tool, f"checkpoint={path}"], cwd=tmp_path, input="red cat\n",
                        env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0]
    assert not marker.exists()


# -- _target_ classes in a checkpoint's config ------------------------------------------------
PLUGIN_MODULE = "my_scorers"
PLUGIN_CLASS = f"{PLUGIN_MODULE}.MyAdditiveScorer"
PLUGIN_SOURCE = """
from pathlib import Path

Path(__file__).with_name("imported").touch()  # importing a module runs its code

from seq2seq.models.attention_scorers import AdditiveScorer


class MyAdditiveScorer(AdditiveScorer):
    \"\"\"A user's scorer: the additive one, from a module outside seq2seq.\"\"\"
"""


@pytest.fixture
def plugin_checkpoint(tmp_path, trained_checkpoint, monkeypatch) -> Path:
    """The copy model, its config naming its scorer ``my_scorers.MyAdditiveScorer``.

    ``my_scorers`` lies in ``tmp_path/plugins`` (importable in this process and through
    PYTHONPATH); importing it creates ``tmp_path/plugins/imported``.
    """
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / f"{PLUGIN_MODULE}.py").write_text(PLUGIN_SOURCE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(plugins))
    monkeypatch.delenv("SEQ2SEQ_TRUSTED_TARGETS", raising=False)
    checkpoint = load_checkpoint(trained_checkpoint)
    checkpoint["config"]["model"]["attention"]["_target_"] = PLUGIN_CLASS
    path = tmp_path / "plugin.pt"
    save_checkpoint(checkpoint, path)
    yield path
    sys.modules.pop(PLUGIN_MODULE, None)  # the next test imports its own copy


def test_check_targets_allows_registry_names_seq2seq_and_torch_nn_only_by_default(monkeypatch):
    monkeypatch.delenv("SEQ2SEQ_TRUSTED_TARGETS", raising=False)
    check_targets({"encoder": {"_target_": "seq2seq.models.encoder.RNNEncoder"},
                   "layers": [{"_target_": "torch.nn.GRU"}, 3, "text"]})
    check_targets({"encoder": {"_target_": "rnn"}, "decoder": {"_target_": "transformer"},
                   "attention": {"_target_": "multihead", "scorer": {"_target_": "additive"}}})
    with pytest.raises(CheckpointError, match="'eval', which is neither a built-in part") as caught:
        check_targets({"attention": {"_target_": "eval"}})
    assert "\n" not in str(caught.value)
    for target in ("os.system", "builtins.eval", "seq2seq_evil.Scorer", "torch.load",
                   "my_scorers.MyAdditiveScorer"):
        nested = {"model": {"decoder": {"layers": [{}, {"_target_": target}]}}}
        with pytest.raises(CheckpointError, match="SEQ2SEQ_TRUSTED_TARGETS") as caught:
            check_targets(nested)
        assert repr(target) in str(caught.value) and "\n" not in str(caught.value)


def test_check_targets_accepts_the_module_prefixes_listed_in_the_environment(monkeypatch):
    monkeypatch.setenv("SEQ2SEQ_TRUSTED_TARGETS", " other.plugins. , my_scorers. ")
    check_targets({"attention": {"_target_": "my_scorers.MyAdditiveScorer"}})
    check_targets({"attention": {"_target_": "other.plugins.deep.Scorer"}})
    check_targets({"attention": {"_target_": "seq2seq.models.attention.DotScorer"}})
    with pytest.raises(CheckpointError, match="os.system"):
        check_targets({"attention": {"_target_": "os.system"}})
    with pytest.raises(CheckpointError, match="my_scorers_2"):
        check_targets({"attention": {"_target_": "my_scorers_2.Scorer"}})


def test_checkpoint_naming_an_untrusted_class_is_refused_before_importing_it(
    plugin_checkpoint, monkeypatch
):
    marker = plugin_checkpoint.parent / "plugins" / "imported"
    with pytest.raises(CheckpointError, match=rf"{PLUGIN_CLASS}.*SEQ2SEQ_TRUSTED_TARGETS"):
        model_from_checkpoint(load_checkpoint(plugin_checkpoint))
    with pytest.raises(CheckpointError, match=PLUGIN_CLASS):
        load_translator(plugin_checkpoint)
    monkeypatch.setenv("SEQ2SEQ_TRUSTED_TARGETS", "some_other_module.")
    with pytest.raises(CheckpointError, match=PLUGIN_CLASS):
        model_from_checkpoint(load_checkpoint(plugin_checkpoint))
    assert not marker.exists(), "the untrusted module was imported"


def test_checkpoint_naming_a_trusted_class_loads_and_translates(
    plugin_checkpoint, trained_checkpoint, monkeypatch
):
    monkeypatch.setenv("SEQ2SEQ_TRUSTED_TARGETS", f"{PLUGIN_MODULE}.")
    model, _, config = model_from_checkpoint(load_checkpoint(plugin_checkpoint))
    assert type(model.decoder.attention.scorer).__name__ == "MyAdditiveScorer"
    assert config["model"]["attention"]["_target_"] == PLUGIN_CLASS
    inputs = ["red cat", "one two big house", "moon"]
    beam2 = DecodeOptions(beam_size=2)
    plugin = load_translator(plugin_checkpoint).translate(inputs, beam2)
    plain = load_translator(trained_checkpoint).translate(inputs, beam2)
    assert [n[0].text for n in plugin] == [n[0].text for n in plain]


def test_translate_command_refuses_an_untrusted_class_and_accepts_a_trusted_one(
    plugin_checkpoint, trained_checkpoint, run_python
):
    plugins = plugin_checkpoint.parent / "plugins"
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(plugins),
                                                       os.environ.get("PYTHONPATH")]))}
    env.pop("SEQ2SEQ_TRUSTED_TARGETS", None)
    command = [ROOT / "translate.py", f"checkpoint={plugin_checkpoint}", "beam_size=2"]
    run = functools.partial(run_python, command, cwd=plugin_checkpoint.parent,
                            input="red cat\n", timeout=120)

    refused = run(env=env)
    assert refused.returncode == 1 and refused.stdout == ""
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), refused.stderr
    assert PLUGIN_CLASS in lines[0] and "SEQ2SEQ_TRUSTED_TARGETS" in lines[0]
    assert not (plugins / "imported").exists()

    accepted = run(env={**env, "SEQ2SEQ_TRUSTED_TARGETS": f"{PLUGIN_MODULE}."})
    assert accepted.returncode == 0, accepted.stderr
    # The plugin scorer is the additive one under another name, on the same weights.
    assert accepted.stdout.splitlines() == api_lines(trained_checkpoint, ["red cat"], beam_size=2)
    assert (plugins / "imported").exists()
