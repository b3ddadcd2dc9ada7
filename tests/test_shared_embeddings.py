"""model.share_all_embeddings: one table for the source embeddings, the target embeddings and
the output layer, built, trained, checked before the data stage, and exported."""

from __future__ import annotations

import pytest
import torch
from conftest import transformer_model_config

from seq2seq.config_types import ConfigError
from seq2seq.models.build import build_model
from seq2seq.training.run import train


def shared_model(vocab: int = 39):
    torch.manual_seed(0)
    config = {**transformer_model_config(), "share_all_embeddings": True}
    return build_model(config, src_vocab_size=vocab, tgt_vocab_size=vocab).eval()


def test_one_table_serves_source_target_and_output():
    model = shared_model()
    table = model.decoder.embedding.weight
    assert model.encoder.embedding.weight is table and model.generator.weight is table
    assert model.generator.bias is None
    separate = build_model(transformer_model_config(), src_vocab_size=39, tgt_vocab_size=39)
    count = sum(p.numel() for p in model.parameters())
    assert sum(p.numel() for p in separate.parameters()) - count == 39 * 12  # the source table
    with pytest.raises(ValueError, match=r"share_all_embeddings needs one vocabulary and one "
                                         r"size on both sides: the source table is \(39, 12\), "
                                         r"the target's \(20, 12\)"):
        build_model({**transformer_model_config(), "share_all_embeddings": True},
                    src_vocab_size=39, tgt_vocab_size=20)


def test_a_pruned_target_is_refused_before_the_data_stage(tiny_train_config, tmp_path):
    cfg = tiny_train_config(**{"model.share_all_embeddings": True, "tokenizer.joint": True})
    with pytest.raises(ConfigError, match=r"^model.share_all_embeddings=true needs one "
                                          r"vocabulary on both sides: tokenizer.joint=true and "
                                          r"tokenizer.prune_target_vocabulary=false$"):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "data").exists()


def test_a_shared_table_trains_saves_and_exports(tiny_train_config, tmp_path):
    """A run keeps the one table through training and its checkpoint; ONNX Runtime and
    CTranslate2 decode the checkpoint as our search does (their own exports' checks)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("ctranslate2")
    from seq2seq.checkpoint import load_checkpoint, model_from_checkpoint
    from seq2seq.export import export_checkpoint

    cfg = tiny_train_config(**{
        "model/encoder": "transformer", "model/decoder": "transformer",
        "model.encoder.hidden_size": None, "model.decoder.hidden_size": None,
        "model.encoder.ffn_dim": 32, "model.decoder.ffn_dim": 32,
        # One layer a side: the table is shared whatever the depth, and each layer is seconds
        # of the ONNX exporter's tracing.
        "model.encoder.num_layers": 1, "model.decoder.num_layers": 1,
        "model.share_all_embeddings": True, "tokenizer.joint": True,
        "tokenizer.prune_target_vocabulary": False, "trainer.max_steps": 10,
        "trainer.valid_every": 10, "trainer.valid.max_sentences": 4})
    train(cfg, tmp_path / "run")
    checkpoint = tmp_path / "run" / "checkpoints" / "last.pt"
    model, _, _ = model_from_checkpoint(load_checkpoint(checkpoint))
    assert model.encoder.embedding.weight is model.generator.weight
    export_checkpoint(checkpoint, tmp_path / "onnx")
    manifest = export_checkpoint(checkpoint, tmp_path / "ct2", format="ctranslate2")
    assert manifest["export"]["largest_log_prob_difference"] < 1e-3


def test_a_run_from_before_the_option_resumes(tiny_train_config, tmp_path):
    """A last.pt whose config has no model.share_all_embeddings (written before the option)
    resumes: the missing option reads as its default."""
    from seq2seq.checkpoint import load_checkpoint, save_checkpoint

    common = {"trainer.valid.max_sentences": 4, "trainer.save_every": 10}
    run = tmp_path / "run"
    train(tiny_train_config(**common, **{"trainer.max_steps": 10}), run)
    last = run / "checkpoints" / "last.pt"
    payload = load_checkpoint(last)
    del payload["config"]["model"]["share_all_embeddings"]
    save_checkpoint(payload, last)
    result = train(tiny_train_config(**common, **{"trainer.max_steps": 12,
                                                  "trainer.resume": "auto"}), run)
    assert load_checkpoint(last)["trainer_state"]["step"] == 12 and result
