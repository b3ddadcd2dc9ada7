"""Make the golden decodings kept in tests/data/: a copy-task checkpoint trained by the code of
one commit, and what that commit's translator decoded with it; tests/test_golden_decodings.py
checks that today's code decodes it alike.

The files come from 3d8c1c7, the commit before the cleanup of #88 (one decoding config, one way
to open a model, the renames), so that the test shows its decodings unchanged. Run it there,
with that tree and its tests first on the import path::

    git worktree add /tmp/before 3d8c1c7
    cd /tmp/before && PYTHONPATH=.:tests python /path/to/tests/data/make_golden_decodings.py

It writes, beside itself:

- ``golden_copy_gru.pt``: the tests' copy model (GRU encoder, Bahdanau decoder, additive
  attention), trained 300 steps as the tests' ``trained_checkpoint`` is, so that its choices on
  copy-task sentences are clear ones (a random model's near-ties could go either way on
  another CPU); its tokenizer without the 240 KB NFKC table, which changes nothing on these
  ASCII sentences (the same pieces and ids);
- ``golden_decodings.json``: the sentences, and for each decoding setting (greedy; beam 5 with
  its 5-best; constraints; prefixes; seeded sampling) its options and every translation's text
  and score, best first.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import conftest
import torch
from conftest import build_copy_checkpoint, sentences
from sentencepiece import sentencepiece_model_pb2

from seq2seq.data.tokenizer import SentencePieceTokenizer, Tokenizers
from seq2seq.inference.decode_options import DecodeOptions
from seq2seq.inference.runtimes import load_translator

HERE = Path(__file__).resolve().parent
CHECKPOINT = HERE / "golden_copy_gru.pt"
GOLDEN = HERE / "golden_decodings.json"
SENTENCES = [*sentences(6, seed=11), ""]  # copy-task sentences, and an empty line
PREFIXES = ["one two", "", "cat", "", "big house", "", ""]
# name -> (DecodeOptions fields, per-sentence prefixes or None, per-sentence constraints or None)
CASES = {
    "greedy": ({"beam_size": 1}, None, None),
    "beam5_nbest5": ({"beam_size": 5, "nbest": 5}, None, None),
    "beam5_constraints": ({"beam_size": 5, "nbest": 2},
                          None, [["green dog"], [], ["moon"], ["red", "sun"], [], [], []]),
    "beam5_prefixes": ({"beam_size": 5, "nbest": 2}, PREFIXES, None),
    "greedy_prefixes": ({"beam_size": 1}, PREFIXES, None),
    "sample_seeded": ({"search": "sample", "beam_size": 1, "nbest": 3, "seed": 7,
                       "temperature": 1.5}, None, None),
}


def identity_normalized(tokenizers: Tokenizers) -> Tokenizers:
    proto = sentencepiece_model_pb2.ModelProto.FromString(tokenizers.src.to_bytes())
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.precompiled_charsmap = b""
    shared = SentencePieceTokenizer.from_bytes(proto.SerializeToString())
    return Tokenizers(src=shared, tgt=shared, joint=True)


def main() -> None:
    torch.set_num_threads(1)
    original = conftest.copy_tokenizers()
    tokenizers = identity_normalized(original)
    text = sentences(conftest.COPY_SPLIT_SIZES["train"], seed=0)
    assert tokenizers.src.encode(text) == original.src.encode(text)
    conftest.copy_tokenizers = lambda: tokenizers  # what build_copy_checkpoint trains and saves
    with tempfile.TemporaryDirectory() as folder:
        made = build_copy_checkpoint(Path(folder), train_steps=300, name="best.pt")
        shutil.copyfile(made, CHECKPOINT)
    translator = load_translator(CHECKPOINT, "cpu", precision="fp32")
    cases = {}
    for name, (fields, prefixes, constraints) in CASES.items():
        results = translator.translate(SENTENCES, DecodeOptions(**fields), return_attention=False,
                                       prefixes=prefixes, constraints=constraints)
        cases[name] = {"options": fields, "prefixes": prefixes, "constraints": constraints,
                       "translations": [[{"text": t.text, "score": t.score} for t in n_best]
                                        for n_best in results]}
    GOLDEN.write_text(json.dumps({"sentences": SENTENCES, "cases": cases}, indent=1) + "\n",
                      encoding="utf-8")


if __name__ == "__main__":
    main()
