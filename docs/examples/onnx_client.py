"""Translate stdin to stdout, a line at a time, with a folder written by seq2seq-export:
greedy search over its two ONNX graphs, with onnxruntime, sentencepiece and numpy only.

    python onnx_client.py exported/x < input.txt > output.txt
"""

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime
import sentencepiece

# translate.py's defaults: sources cut to 250 pieces; at most floor(1.5 * n + 10) output
# pieces, where n counts the source's pieces and its EOS.
MAX_SOURCE_PIECES, MAX_LEN_A, MAX_LEN_B = 250, 1.5, 10

folder = Path(sys.argv[1])
manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
vocabulary, graphs = manifest["vocabulary"], manifest["graphs"]
files = manifest["tokenizers"]["files"]  # "tgt" only when the target has its own model
source, target = (sentencepiece.SentencePieceProcessor(model_file=str(folder / name))
                  for name in (files["src"], files.get("tgt", files["src"])))
encoder, step = (onnxruntime.InferenceSession(str(folder / graphs[name]),
                                              providers=["CPUExecutionProvider"])
                 for name in ("encoder", "decoder_step"))
# A logits column (and a prev_tokens value) is an index into target_ids, not a sentencepiece id.
target_ids = np.array(vocabulary["target_ids"])


def translate(line: str) -> str:
    pieces = source.encode(line)[:MAX_SOURCE_PIECES]
    if not pieces:  # an empty line: an empty translation, as translate.py gives
        return ""
    src = np.array([pieces + [vocabulary["eos_id"]]], dtype=np.int64)  # (1, n)
    src_lengths = np.array([src.shape[1]], dtype=np.int64)  # (1,) no padding here
    outputs = encoder.run(None, {"src": src, "src_lengths": src_lengths})
    # memory, mask and keys, then the decoder's initial state, named as the step's inputs.
    feeds = dict(zip((output.name for output in encoder.get_outputs()), outputs, strict=True))
    tokens: list[int] = []
    while len(tokens) < int(MAX_LEN_A * src.shape[1] + MAX_LEN_B):
        feeds["prev_tokens"] = np.array([tokens[-1] if tokens else vocabulary["bos_id"]],
                                         dtype=np.int64)
        logits, _weights, *state = step.run(None, feeds)
        feeds.update(zip(graphs["state"], state, strict=True))  # output new_X is input X
        logits[0, [vocabulary["pad_id"], vocabulary["bos_id"]]] = -np.inf  # never generated
        token = int(logits[0].argmax())
        if token == vocabulary["eos_id"]:
            break
        tokens.append(token)
    return target.decode(target_ids[tokens].tolist())


for line in sys.stdin:
    print(translate(line.rstrip("\n")), flush=True)
