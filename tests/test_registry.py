"""Built-in model parts by registry name, and the checkpoint format that names them.

A checkpoint of format version 1 (kept in tests/data/, made by tests/data/make_old_checkpoint.py
with the code of that time) named the classes by import path; today's code converts it on load
and must compute what the old code computed with it.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from conftest import checkpoint_payload, copy_model_config, copy_tokenizers

from seq2seq import CONFIG_DIR
from seq2seq.checkpoint import (
    FORMAT_VERSION,
    CheckpointError,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
)
from seq2seq.config_types import ConfigError, accepted_parameters
from seq2seq.data.batching import collate
from seq2seq.data.vocab import BOS_ID, EOS_ID
from seq2seq.inference.model_files import read_exported
from seq2seq.models import registry
from seq2seq.models.build import build_model, check_model_config, decoder_takes, uses_scorer
from seq2seq.models.registry import COMPONENTS, DECODER, ENCODER, SCORER, upgrade_config
from seq2seq.training.state import TrainerState
from seq2seq.training.trainer import Trainer

DATA = Path(__file__).resolve().parent / "data"
EXPECTED = json.loads((DATA / "checkpoint_v1_expected.json").read_text(encoding="utf-8"))
# A greedy step is compared only while the old code's best logit led the second by more than
# float noise: past a near-tie, another CPU may rightly continue otherwise.
CLEAR_MARGIN = 1e-3
GROUP_KINDS = {"encoder": ENCODER, "decoder": DECODER, "attention": SCORER}


# -- the registry and the configs ----------------------------------------------------------------
def test_every_entry_names_an_importable_class_of_its_kind():
    from seq2seq.models.attention_scorers import Scorer

    for kind, components in COMPONENTS.items():
        for name, component in components.items():
            assert component.name == name and not registry.is_class_path(name)
            cls = component.load()
            assert isinstance(cls, type)
            if kind == SCORER:
                assert issubclass(cls, Scorer)


def test_class_names_are_read_without_importing():
    assert registry.class_name(SCORER, "additive") == "AdditiveScorer"
    assert registry.class_name(DECODER, "transformer") == "TransformerDecoder"
    assert registry.class_name(SCORER, "my_module.CosineScorer") == "CosineScorer"


@pytest.mark.parametrize("path", sorted((CONFIG_DIR / "model").rglob("*.yaml")),
                         ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_the_config_files_name_built_ins_by_registry_name(path):
    node = yaml.safe_load(path.read_text(encoding="utf-8"))
    kind = GROUP_KINDS[path.parent.name]
    assert node["_target_"] in COMPONENTS[kind]
    if kind == SCORER:  # named as its file
        assert node["_target_"] == path.stem
    if isinstance(node.get("scorer"), dict):  # the multi-head scorer's inner one
        assert node["scorer"]["_target_"] in COMPONENTS[SCORER]


def test_the_registry_says_which_decoder_takes_a_scorer_and_the_encoders_final_size():
    assert uses_scorer({"_target_": "luong"}) and uses_scorer({"_target_": "bahdanau"})
    assert not uses_scorer({"_target_": "transformer"})
    assert decoder_takes({"_target_": "bahdanau"}, "encoder_final_size")
    assert not decoder_takes({"_target_": "transformer"}, "encoder_final_size")
    # The registry's word agrees with the classes it names.
    for component in COMPONENTS[DECODER].values():
        parameters, _, _ = accepted_parameters(component.load())
        assert component.takes_attention == ("attention" in parameters)
        assert component.takes_encoder_final_size == ("encoder_final_size" in parameters)


def test_an_unknown_registry_name_is_a_one_line_error_naming_it():
    config = copy_model_config()
    config["attention"]["_target_"] = "addittive"
    for check in (check_model_config,
                  lambda cfg: build_model(cfg, src_vocab_size=10, tgt_vocab_size=10)):
        with pytest.raises(ConfigError) as caught:
            check(config)
        message = str(caught.value)
        assert "\n" not in message and "model.attention._target_: 'addittive'" in message
        assert "additive" in message  # the names there are
    # A name of another kind is no encoder.
    config = copy_model_config()
    config["encoder"]["_target_"] = "additive"
    with pytest.raises(ConfigError, match="model.encoder._target_: 'additive' is no built-in "
                                          "encoder"):
        check_model_config(config)


def test_the_inner_scorer_of_the_multihead_scorer_is_resolved_too():
    config = copy_model_config(attention="multihead")
    config["attention"].update(heads=2, scorer={"_target_": "scaled_dot", "_partial_": True})
    model = build_model(config, src_vocab_size=10, tgt_vocab_size=10)
    assert type(model.decoder.attention.scorer.inner).__name__ == "ScaledDotScorer"
    config["attention"]["scorer"]["_target_"] = "nope"
    with pytest.raises(ConfigError, match="model.attention.scorer._target_: 'nope'"):
        check_model_config(config)


# -- the format version and the conversion step --------------------------------------------------
V1_MODEL_CONFIG = {
    "embed_dim": 8,
    "encoder": {"_target_": "seq2seq.models.encoder.RNNEncoder", "rnn_type": "lstm"},
    "decoder": {"_target_": "seq2seq.models.decoders.BahdanauDecoder"},
    "attention": {"_target_": "seq2seq.models.attention.MultiHeadScorer", "heads": 2,
                  "scorer": {"_target_": "seq2seq.models.scorers.GaussianScorer",
                             "_partial_": True}},
}


def test_the_conversion_names_every_built_in_and_keeps_a_users_class():
    config = {"model": V1_MODEL_CONFIG, "optimizer": {"_target_": "torch.optim.Adam"}}
    converted = upgrade_config(config, 1)
    model = converted["model"]
    assert (model["encoder"]["_target_"], model["decoder"]["_target_"],
            model["attention"]["_target_"], model["attention"]["scorer"]["_target_"]) == (
        "rnn", "bahdanau", "multihead", "gaussian")
    assert model["encoder"]["rnn_type"] == "lstm" and model["attention"]["scorer"]["_partial_"]
    assert converted["optimizer"] == {"_target_": "torch.optim.Adam"}  # not a model part
    assert config["model"]["encoder"]["_target_"].endswith("RNNEncoder")  # a new dict
    assert upgrade_config(converted, 1) == converted  # today's form passes through
    assert upgrade_config(config, 2) == config  # no step from today's version
    user = {"model": {"attention": {"_target_": "my_scorers.CosineScorer"}}}
    assert upgrade_config(user, 1) == user


def test_every_version_1_path_of_a_config_file_converts_to_that_files_name():
    # The version-1 paths were the class's module path, the scorers' through attention.py.
    for path in sorted((CONFIG_DIR / "model").rglob("*.yaml")):
        name = yaml.safe_load(path.read_text(encoding="utf-8"))["_target_"]
        component = COMPONENTS[GROUP_KINDS[path.parent.name]][name]
        old_paths = [component.class_path]
        if component.class_path.startswith("seq2seq.models.attention_scorers."):
            scorer = component.class_path.rpartition(".")[2]  # where version 1 named them
            old_paths = [f"seq2seq.models.{module}.{scorer}" for module in ("scorers", "attention")]
        for old in old_paths:
            node = {"model": {path.parent.name: {"_target_": old}}}
            assert upgrade_config(node, 1)["model"][path.parent.name]["_target_"] == name


def make_new_checkpoint(path: Path, model_cfg: dict) -> Path:
    """A checkpoint as the trainer writes one (Trainer.checkpoint_payload), without training."""
    tokenizers = copy_tokenizers()
    model = build_model(model_cfg, src_vocab_size=tokenizers.src.vocab_size,
                        tgt_vocab_size=tokenizers.tgt.vocab_size)
    trainer = SimpleNamespace(model=model, validated_model=model, ema=None,
                              config={"model": model_cfg}, tokenizers=tokenizers,
                              state=TrainerState())
    save_checkpoint(Trainer.checkpoint_payload(trainer, with_training_state=False), path)
    return path


def test_a_new_checkpoint_has_the_new_version_and_registry_names(tmp_path):
    path = make_new_checkpoint(tmp_path / "new.pt", copy_model_config())
    raw = torch.load(path, weights_only=True)
    assert raw["format_version"] == FORMAT_VERSION == 2
    model = raw["config"]["model"]
    assert (model["encoder"]["_target_"], model["decoder"]["_target_"],
            model["attention"]["_target_"]) == ("rnn", "bahdanau", "additive")
    assert model_from_checkpoint(load_checkpoint(path))[0].decoder.attention is not None


def test_a_general_checkpoint_from_before_the_scale_option_loads_as_it_was(tmp_path):
    """``model.attention.scale`` (general's 1/sqrt(d)) came later: a checkpoint whose config has
    no such key builds Luong's unscaled scorer, and its weights fit a scaled one too (the option
    adds no parameter)."""
    before = copy_model_config(attention="general")
    assert before["attention"].pop("scale") is False
    path = make_new_checkpoint(tmp_path / "general.pt", before)
    model, _, config = model_from_checkpoint(load_checkpoint(path))
    assert "scale" not in config["model"]["attention"]
    assert model.decoder.attention.scorer.scale is None
    scaled_cfg = copy_model_config(attention="general")
    scaled_cfg["attention"]["scale"] = True
    tokenizers = copy_tokenizers()
    scaled = build_model(scaled_cfg, src_vocab_size=tokenizers.src.vocab_size,
                         tgt_vocab_size=tokenizers.tgt.vocab_size)
    scaled.load_state_dict(model.state_dict())
    assert scaled.decoder.attention.scorer.scale == pytest.approx(64 ** -0.5)


def test_a_users_class_path_survives_saving_and_loading(tmp_path, monkeypatch):
    model_cfg = copy_model_config()
    model_cfg["attention"]["_target_"] = f"{__name__}.UsersScorer"
    path = make_new_checkpoint(tmp_path / "user.pt", model_cfg)
    monkeypatch.setenv("SEQ2SEQ_TRUSTED_TARGETS", f"{__name__}.")
    model, _, config = model_from_checkpoint(load_checkpoint(path))
    assert config["model"]["attention"]["_target_"] == f"{__name__}.UsersScorer"
    assert type(model.decoder.attention.scorer) is UsersScorer


def _users_scorer_class():
    from seq2seq.models.attention_scorers import AdditiveScorer

    class UsersScorer(AdditiveScorer):
        """A user's scorer, named by its import path."""

    UsersScorer.__module__ = __name__
    return UsersScorer


UsersScorer = _users_scorer_class()


@pytest.mark.parametrize("target, reason", [
    ("addittive", "neither a built-in part"),
    ("evil_module.Scorer", "SEQ2SEQ_TRUSTED_TARGETS"),
])
def test_a_checkpoint_naming_an_unknown_or_untrusted_target_is_a_one_line_error(
        tmp_path, monkeypatch, target, reason):
    monkeypatch.delenv("SEQ2SEQ_TRUSTED_TARGETS", raising=False)
    payload = checkpoint_payload(build_model(copy_model_config(), src_vocab_size=39,
                                             tgt_vocab_size=39), {})
    payload["config"]["model"]["attention"]["_target_"] = target
    save_checkpoint(payload, tmp_path / "bad.pt")
    with pytest.raises(CheckpointError) as caught:
        model_from_checkpoint(load_checkpoint(tmp_path / "bad.pt"))
    message = str(caught.value)
    assert repr(target) in message and reason in message and "\n" not in message


def test_a_newer_format_version_is_refused(tmp_path):
    payload = checkpoint_payload(build_model(copy_model_config(), src_vocab_size=39,
                                             tgt_vocab_size=39), {})
    payload["format_version"] = FORMAT_VERSION + 1
    save_checkpoint(payload, tmp_path / "future.pt")
    with pytest.raises(CheckpointError, match=f"format version {FORMAT_VERSION + 1}; this "
                                              f"seq2seq reads versions 1 to {FORMAT_VERSION}"):
        load_checkpoint(tmp_path / "future.pt")


def test_an_exported_folders_config_of_version_1_is_converted(tmp_path, monkeypatch):
    import seq2seq.inference.model_files as loading

    manifest = {"config": {"model": V1_MODEL_CONFIG},
                "tokenizers": {"joint": True, "files": {"src": "sp.model"}}}
    (tmp_path / "sp.model").write_bytes(copy_tokenizers().src.to_bytes())
    monkeypatch.setattr(loading, "read_manifest", lambda folder: manifest)
    payload = read_exported(tmp_path)
    assert payload["config"]["model"]["attention"]["scorer"]["_target_"] == "gaussian"


# -- a checkpoint written by the code of format version 1 ----------------------------------------
@pytest.fixture(scope="module", params=sorted(EXPECTED))
def old_checkpoint(request):
    """(the loaded version-1 checkpoint, its model, tokenizers, what the old code computed)."""
    checkpoint = load_checkpoint(DATA / f"checkpoint_v1_{request.param}.pt")
    model, tokenizers, _ = model_from_checkpoint(checkpoint)
    return checkpoint, model, tokenizers, EXPECTED[request.param]


def test_the_old_checkpoint_is_converted_on_load(old_checkpoint):
    checkpoint, _, _, _ = old_checkpoint
    raw = torch.load(DATA / "checkpoint_v1_additive.pt", weights_only=True)
    assert raw["format_version"] == 1
    assert raw["config"]["model"]["attention"]["_target_"] == \
        "seq2seq.models.attention.AdditiveScorer"
    assert checkpoint["format_version"] == FORMAT_VERSION
    targets = [node["_target_"] for node in checkpoint["config"]["model"].values()
               if isinstance(node, dict)]
    assert targets and all(registry.is_registered(target) for target in targets)


def test_the_old_checkpoint_gives_the_old_teacher_forced_logits(old_checkpoint):
    _, model, tokenizers, expected = old_checkpoint
    source_ids = tokenizers.src.encode(expected["sources"])
    target_ids = tokenizers.tgt.encode(expected["targets"])
    assert source_ids == expected["source_ids"] and target_ids == expected["target_ids"]
    batch = collate([(np.asarray(s), np.asarray(t))
                     for s, t in zip(source_ids, target_ids, strict=True)])
    with torch.no_grad():
        features, _ = model(batch.src, batch.src_lengths, batch.tgt_in)
        logits = model.project(features)
    torch.testing.assert_close(logits, torch.tensor(expected["logits"]), atol=1e-5, rtol=1e-5)


def greedy_ids(model, src: torch.Tensor, steps: int) -> list[int]:
    encoded = model.encode(src, torch.tensor([src.size(1)]))
    state = model.init_state(encoded)
    token, ids = torch.tensor([BOS_ID]), []
    for _ in range(steps):
        logits, _, state = model.decode_step(token, state, encoded)
        token = logits.argmax(-1)
        ids.append(int(token))
        if ids[-1] == EOS_ID:
            break
    return ids


def test_the_old_checkpoint_gives_the_old_greedy_output(old_checkpoint):
    _, model, _, expected = old_checkpoint
    for source_ids, old in zip(expected["source_ids"], expected["greedy"], strict=True):
        clear = next((step for step, margin in enumerate(old["margins"])
                      if margin < CLEAR_MARGIN), len(old["margins"]))
        assert clear >= 3, "the kept file's margins are too small to compare anything"
        src = torch.tensor([[*source_ids, EOS_ID]])
        with torch.no_grad():
            ids = greedy_ids(model, src, len(old["ids"]))
        assert ids[:clear] == old["ids"][:clear]


@pytest.mark.parametrize(("node", "message"), [
    ({"_target_": "luong", "hiden_size": 3}, "model.decoder.hiden_size: "
     "seq2seq.models.decoders.LuongDecoder takes no argument 'hiden_size'"),
    ({"_target_": "bahdanau", "input_feeding": True}, "model.decoder.input_feeding: "
     "seq2seq.models.decoders.BahdanauDecoder takes no argument 'input_feeding'"),
    ({"_target_": "luong", "num_layers": "x"}, "model.decoder.num_layers: expected an integer"),
])
def test_a_decoder_passing_its_options_on_is_checked_against_its_base(node, message):
    """The RNN decoders take their base's arguments as ``**options``: a typo or a wrong type
    among those is still refused by name, before anything is built."""
    from seq2seq.config_types import check_target_arguments
    from seq2seq.models.build import resolve_targets

    with pytest.raises(ConfigError, match=message):
        check_target_arguments(resolve_targets(node, DECODER, "model.decoder"), "model.decoder")
