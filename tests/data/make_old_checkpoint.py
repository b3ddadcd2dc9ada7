"""Make the format-version-1 checkpoints kept in tests/data/, and what the code of that time
computed with them; tests/test_registry.py checks that today's code loads them alike.

Version 1 named the model's classes in the config by import path
(``seq2seq.models.attention.AdditiveScorer``); later versions convert that on load. The files
must therefore come from the code of that time, the commit before the registry of component
names (6fa1eef). Run it there, with that tree first on the import path::

    git worktree add /tmp/before 6fa1eef
    cd /tmp/before && PYTHONPATH=. python /path/to/tests/data/make_old_checkpoint.py

It writes, beside itself:

- ``checkpoint_v1_additive.pt``: a GRU encoder, Luong decoder, additive attention;
- ``checkpoint_v1_transformer.pt``: a one-layer Transformer;
- ``checkpoint_v1_expected.json``: for each, the source and target sentences, their piece ids,
  the teacher-forced logits (batch, step, vocabulary), and per sentence the greedy output ids
  with the margin between the best and second-best logit at each step (a step whose margin is
  within float noise cannot be compared across CPUs).

Each model is the real train config (``train.yaml`` composed by Hydra) shrunk to a few thousand
parameters, with fixed random weights (seed 0) and a joint sentencepiece vocabulary of 32
pieces trained on a few sentences, identity-normalized to keep the file small (the default
normalization table alone is 240 KB).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

import seq2seq
from seq2seq import CONFIG_DIR
from seq2seq.checkpoint import FORMAT_VERSION, save_checkpoint, tokenizers_to_payload
from seq2seq.data.batching import collate
from seq2seq.data.tokenizer import SentencePieceTokenizer, Tokenizers
from seq2seq.data.vocab import (
    BOS_ID,
    BOS_PIECE,
    EOS_ID,
    EOS_PIECE,
    PAD_ID,
    PAD_PIECE,
    UNK_ID,
    UNK_PIECE,
)
from seq2seq.models.build import build_model

HERE = Path(__file__).resolve().parent
EXPECTED = HERE / "checkpoint_v1_expected.json"
TRAINING_TEXT = [
    "a red cat sits on the mat", "the dog runs in the park", "two men play in the snow",
    "a girl reads a book", "a small bird sings in the tree", "the big house has a red door",
]
SOURCES = ["a red cat runs", "the girl"]
TARGETS = ["the dog sits", "a bird"]
GREEDY_STEPS = 8
MODELS = {
    "additive": ["model/encoder=gru", "model/decoder=luong", "model/attention=additive",
                 "model.embed_dim=8", "model.encoder.hidden_size=6",
                 "model.decoder.hidden_size=12"],
    "transformer": ["model/encoder=transformer", "model/decoder=transformer", "~model/attention",
                    "model.embed_dim=8", "model.encoder.num_heads=2", "model.encoder.num_layers=1",
                    "model.encoder.ffn_dim=16", "model.decoder.num_heads=2",
                    "model.decoder.num_layers=1", "model.decoder.ffn_dim=16"],
}


def tokenizers() -> Tokenizers:
    writer = io.BytesIO()
    spm.set_random_generator_seed(1)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TRAINING_TEXT), model_writer=writer, model_type="unigram",
        vocab_size=32, hard_vocab_limit=False, normalization_rule_name="identity",
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, pad_piece=PAD_PIECE,
        unk_piece=UNK_PIECE, bos_piece=BOS_PIECE, eos_piece=EOS_PIECE, num_threads=1,
        minloglevel=2)
    shared = SentencePieceTokenizer(model_proto=writer.getvalue())
    return Tokenizers(src=shared, tgt=shared, joint=True)


def train_config(overrides: list[str]) -> dict:
    """``train.yaml`` as train.py composes and resolves it, with the model shrunk."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["model.dropout=0.0", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def greedy(model, src, src_lengths) -> tuple[list[int], list[float]]:
    """The greedy output ids of one sentence, and each step's best-minus-second logit."""
    encoded = model.encode(src, src_lengths)
    state = model.init_state(encoded)
    token = torch.tensor([BOS_ID])
    ids, margins = [], []
    for _ in range(GREEDY_STEPS):
        logits, _, state = model.decode_step(token, state, encoded)
        top = logits[0].topk(2).values
        token = logits.argmax(-1)
        ids.append(int(token))
        margins.append(float(top[0] - top[1]))
        if int(token) == EOS_ID:
            break
    return ids, margins


def expected_outputs(model, shared: Tokenizers) -> dict:
    src_ids, tgt_ids = shared.src.encode(SOURCES), shared.tgt.encode(TARGETS)
    batch = collate([(np.asarray(s), np.asarray(t)) for s, t in zip(src_ids, tgt_ids, strict=True)])
    with torch.no_grad():
        features, _ = model(batch.src, batch.src_lengths, batch.tgt_in)
        logits = model.project(features)
        searched = [greedy(model, batch.src[row:row + 1, :int(batch.src_lengths[row])],
                           batch.src_lengths[row:row + 1]) for row in range(len(SOURCES))]
    return {
        "sources": SOURCES, "targets": TARGETS, "source_ids": src_ids, "target_ids": tgt_ids,
        "logits": logits.numpy().round(6).tolist(),  # rounding: 5e-7 at most
        "greedy": [{"ids": ids, "margins": margins} for ids, margins in searched],
    }


def main() -> None:
    if FORMAT_VERSION != 1:
        raise SystemExit(f"run this with the code of checkpoint format version 1 (this "
                         f"{seq2seq.__file__} writes version {FORMAT_VERSION}); see the docstring")
    shared = tokenizers()
    expected = {}
    for name, overrides in MODELS.items():
        config = train_config(overrides)
        torch.manual_seed(0)
        model = build_model(config["model"], src_vocab_size=shared.src.vocab_size,
                            tgt_vocab_size=shared.tgt.vocab_size).eval()
        with torch.no_grad():  # larger logits: clearer greedy margins
            model.generator.weight.mul_(4.0)
        payload = {"format_version": FORMAT_VERSION, "model": model.state_dict(),
                   "config": config, "tokenizers": tokenizers_to_payload(shared),
                   "torch_version": str(torch.__version__)}
        save_checkpoint(payload, HERE / f"checkpoint_v1_{name}.pt")
        expected[name] = expected_outputs(model, shared)
    EXPECTED.write_text(json.dumps(expected, indent=1) + "\n", encoding="utf-8")
    print(f"made with {Path(seq2seq.__file__).parent}")
    for path in sorted(HERE.glob("checkpoint_v1_*")):
        print(f"{path.name}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
