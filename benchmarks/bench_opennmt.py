"""Decoding speed against OpenNMT-py 3.5.1 on the same sentences, pieces and machine, in one run.

OpenNMT-py is not a dependency. Install it beside the project's torch, without its
dependencies, and give its folder as ``--onmt-path``:

    .venv/bin/pip install --no-deps --target /tmp/onmt opennmt-py==3.5.1 configargparse pyonmttok
    python -m benchmarks.bench_opennmt \\
        --checkpoint runs/multi30k_gru_additive/checkpoints/best.pt \\
        --onmt-path /tmp/onmt --workdir bench/opennmt --train-steps 1200

What it does:

1. Writes the Multi30k train / valid / test_2016 text of ``--checkpoint``'s data config as the
   checkpoint's own sentencepiece pieces (space-separated), so both toolkits see the same
   pieces and the same vocabulary.
2. Unless ``--onmt-model`` is given, trains OpenNMT-py's like-for-like model on them
   (``onmt_build_vocab`` + ``onmt_train``, ``--train-steps`` steps): bidirectional
   GRU encoder 2 x 256, 1-layer GRU decoder 512 with input feeding and the MLP (additive)
   scorer, embeddings 256, dropout 0.2, Adam 1e-3, 64-sentence batches, gradient norm 1.
3. Decodes test_2016 with ``onmt_translate -beam_size 5`` and ``-beam_size 1`` (greedy),
   batch 64 sentences, timed by its own ``-report_time`` (generation only), detokenizes and
   scores with sacreBLEU.
4. Decodes the same sentences with this project (:mod:`benchmarks.bench_decoding`) in fp32
   and bf16, and prints sentences/s, BLEU and the ratio to OpenNMT-py for each row, with our
   matrix-product FLOP per sentence and the share of this CPU's matmul ceiling (measured in
   the same run, as :mod:`benchmarks.bench` does) that each row reaches.
5. Prints what each speed target (greedy 3x OpenNMT-py in any precision, beam 5 2.5x in fp32
   and 4x in bf16) asks of the matrix units: the target's sentences/s times our FLOP per
   sentence, as a percentage of the ceiling of that precision. A target above 100% cannot be
   met by a faster implementation of the same products, only by doing fewer of them.

OpenNMT-py imports a few modules at start-up that only its other transforms use (spacy,
pyahocorasick, rapidfuzz, fasttext); empty stand-ins are written to ``WORKDIR/stubs``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPLIT_NAMES = ("train", "valid", "test")
STUB_MODULES = {"spacy": "", "ahocorasick": "", "fasttext": "", "rapidfuzz": "fuzz = process = None\n"}
# Speed targets: (variant, beam size, times OpenNMT-py's sentences/s).
TARGETS = (("fp32", 1, 3.0), ("bf16", 1, 3.0), ("fp32", 5, 2.5), ("bf16", 5, 4.0))
TOTAL_TIME = re.compile(r"Total translation time \(s\): ([\d.]+)")


def onmt_config(workdir: Path, train_steps: int) -> str:
    """OpenNMT-py's YAML for the like-for-like model (see the module docstring)."""
    pieces = workdir / "pieces"
    return f"""\
save_data: {workdir}/onmt
src_vocab: {workdir}/onmt.vocab.src
tgt_vocab: {workdir}/onmt.vocab.tgt
src_vocab_size: 8000
tgt_vocab_size: 8000
overwrite: true
data:
  corpus_1:
    path_src: {pieces}/train.src
    path_tgt: {pieces}/train.tgt
  valid:
    path_src: {pieces}/valid.src
    path_tgt: {pieces}/valid.tgt
src_seq_length: 100
tgt_seq_length: 100
save_model: {workdir}/model
save_checkpoint_steps: {train_steps}
train_steps: {train_steps}
valid_steps: {train_steps}
report_every: 100
encoder_type: brnn
decoder_type: rnn
rnn_type: GRU
enc_layers: 1
dec_layers: 1
hidden_size: 512
word_vec_size: 256
global_attention: mlp
input_feed: 1
bridge: true
dropout: [0.2]
optim: adam
learning_rate: 0.001
max_grad_norm: 1.0
param_init: 0.0
param_init_glorot: true
batch_type: sents
batch_size: 64
valid_batch_size: 64
num_workers: 0
seed: 1
"""


def target_base(tokenizers):
    """The target side's full sentencepiece model (joint vocabularies keep a subset on top)."""
    return getattr(tokenizers.tgt, "base", tokenizers.tgt)


def write_pieces(tokenizers, files: dict, folder: Path,
                 max_test: int | None) -> tuple[list[str], list[str]]:
    """The splits as pieces in ``folder``; returns the test sources and references (raw)."""
    from seq2seq.inference.evaluation import read_parallel

    folder.mkdir(parents=True, exist_ok=True)
    # Target pieces come from the target tokenizer's base model, so the OpenNMT-py vocabulary
    # holds the same piece strings as ours.
    sides = {"src": tokenizers.src, "tgt": target_base(tokenizers)}
    test = ([], [])
    for split in SPLIT_NAMES:
        sources, targets = read_parallel(*files[split])
        if split == "test":
            sources, targets = sources[:max_test], targets[:max_test]
            test = (sources, targets)
        for side, lines in (("src", sources), ("tgt", targets)):
            tokenizer = sides[side]
            text = "\n".join(" ".join(tokenizer.id_to_piece(i) for i in ids)
                             for ids in tokenizer.encode(lines))
            (folder / f"{split}.{side}").write_text(text + "\n", encoding="utf-8")
    return test


def detokenize(lines: list[str], tokenizers) -> list[str]:
    base = target_base(tokenizers)
    piece_ids = {base.id_to_piece(i): i for i in range(base.vocab_size)}
    return base.decode([[piece_ids.get(piece, 1) for piece in line.split()] for line in lines])


def run_onmt(tool: str, args: list[str], env: dict, log: Path) -> str:
    command = [sys.executable, "-c", f"from onmt.bin.{tool} import main; main()", *args]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    log.write_text(result.stdout + result.stderr, encoding="utf-8")
    if result.returncode != 0:
        raise SystemExit(f"OpenNMT-py {tool} failed (log: {log}):\n{result.stderr[-2000:]}")
    return result.stdout + result.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="this project's model")
    parser.add_argument("--onmt-path", type=Path, required=True,
                        help="folder where opennmt-py 3.5.1 is installed (pip --target)")
    parser.add_argument("--onmt-model", type=Path, default=None,
                        help="an OpenNMT-py checkpoint to decode with; default: train one")
    parser.add_argument("--train-steps", type=int, default=1200)
    parser.add_argument("--workdir", type=Path, default=ROOT / "bench" / "opennmt")
    parser.add_argument("--variants", nargs="+", default=["fp32", "bf16"],
                        choices=["fp32", "bf16", "fp16"], help="autocast dtypes of our search")
    parser.add_argument("--max-sentences", type=int, default=None,
                        help="decode the first N test sentences only (a quick check)")
    args = parser.parse_args()

    import sacrebleu
    import torch

    workdir = args.workdir.resolve()
    stubs = workdir / "stubs"
    stubs.mkdir(parents=True, exist_ok=True)
    for name, body in STUB_MODULES.items():
        (stubs / f"{name}.py").write_text(f"# stand-in: unused by the RNN pipeline\n{body}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(args.onmt_path.resolve()), str(stubs), os.environ.get("PYTHONPATH", "")]))
    # OpenNMT-py 3.5.1 pickles its options (an argparse.Namespace) into its checkpoints, which
    # torch.load refuses by default since torch 2.6; the model is the one trained above.
    env["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
    from seq2seq.checkpoint import CheckpointError, load_checkpoint, tokenizers_from_payload
    from seq2seq.data.sources import corpus_files_from_config
    from seq2seq.data.text_files import DataError

    if not (args.onmt_path / "onmt").is_dir():
        raise SystemExit(f"error: no OpenNMT-py in {args.onmt_path}; install it with `pip install "
                         f"--no-deps --target {args.onmt_path} opennmt-py==3.5.1 configargparse "
                         "pyonmttok`")
    try:
        payload = load_checkpoint(args.checkpoint)
        tokenizers = tokenizers_from_payload(payload["tokenizers"])
        files = corpus_files_from_config(payload["config"]["data"])
        sources, references = write_pieces(tokenizers, files, workdir / "pieces",
                                           args.max_sentences)
    except (CheckpointError, DataError) as error:
        raise SystemExit(f"error: {error}") from None

    model = args.onmt_model
    if model is None:
        config = workdir / "onmt.yaml"
        config.write_text(onmt_config(workdir, args.train_steps), encoding="utf-8")
        run_onmt("build_vocab", ["-config", str(config), "-n_sample", "-1"], env,
                 workdir / "build_vocab.log")
        run_onmt("train", ["-config", str(config)], env, workdir / "train.log")
        model = workdir / f"model_step_{args.train_steps}.pt"

    print(f"CPU threads {torch.get_num_threads()}, torch {torch.__version__}; "
          f"test_2016, {len(sources)} sentences")
    rows = []
    for beam in (1, 5):
        output = workdir / f"onmt.beam{beam}.pieces"
        log = run_onmt("translate", [
            "-model", str(model), "-src", str(workdir / "pieces" / "test.src"),
            "-output", str(output), "-beam_size", str(beam), "-batch_size", "64",
            "-batch_type", "sents", "-max_length", "100", "-report_time", "-gpu", "-1",
        ], env, workdir / f"translate.beam{beam}.log")
        seconds = float(TOTAL_TIME.search(log).group(1))
        hypotheses = detokenize(output.read_text(encoding="utf-8").splitlines(), tokenizers)
        rows.append({"toolkit": "OpenNMT-py 3.5.1", "variant": "fp32", "beam_size": beam,
                     "sentences_per_second": len(sources) / seconds,
                     "bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score})
    onmt_speed = {row["beam_size"]: row["sentences_per_second"] for row in rows}
    from benchmarks.bench import cpu_model, matmul_ceilings, runs_for, skip_reason

    ceilings, ceiling_line = matmul_ceilings()
    variants_run = runs_for(ceilings, args.variants)["decoding"]
    for variant in args.variants:
        if variant not in variants_run:
            print(f"{variant} skipped: {skip_reason(variant)}", flush=True)
            continue
        result = subprocess.run(
            [sys.executable, "-m", "benchmarks.bench_decoding", "--checkpoint",
             str(args.checkpoint), "--split", "test", "--precision", variant, "--count-flops",
             *(["--max-sentences", str(args.max_sentences)] if args.max_sentences else []),
             "--json", str(workdir / f"seq2seq.{variant}.json")],
            capture_output=True, text=True, cwd=ROOT)
        if result.returncode != 0:
            raise SystemExit(f"benchmarks.bench_decoding failed:\n{result.stderr[-2000:]}")
        report = json.loads((workdir / f"seq2seq.{variant}.json").read_text())
        for row in report["results"]:
            rows.append({"toolkit": "seq2seq", "variant": variant, "beam_size": row["beam_size"],
                         "sentences_per_second": row["sentences_per_second"],
                         "bleu": row["bleu"], "flops_per_sentence": row["flops_per_sentence"],
                         "ceiling": variant})

    print(f"CPU: {cpu_model()}; {ceiling_line}")

    print(f"{'toolkit':<18} {'search':<7} {'variant':<8} {'sent/s':>8} {'x OpenNMT-py':>13} "
          f"{'BLEU':>6} {'MFLOP/sent':>10} {'% ceiling':>10}")
    for row in rows:
        row["ratio_to_opennmt"] = row["sentences_per_second"] / onmt_speed[row["beam_size"]]
        search = "greedy" if row["beam_size"] == 1 else f"beam{row['beam_size']}"
        flops = row.get("flops_per_sentence")
        counted = f"{'-':>10} {'-':>10}"
        if flops is not None and row["ceiling"] in ceilings:
            row["percent_of_ceiling"] = (
                100 * row["sentences_per_second"] * flops / (ceilings[row["ceiling"]] * 1e9))
            counted = f"{flops / 1e6:>10.1f} {row['percent_of_ceiling']:>9.0f}%"
        print(f"{row['toolkit']:<18} {search:<7} {row['variant']:<8} "
              f"{row['sentences_per_second']:>8.1f} {row['ratio_to_opennmt']:>12.2f}x "
              f"{row['bleu']:>6.2f} {counted}")
    counted = {(row["variant"], row["beam_size"]): row["flops_per_sentence"] for row in rows
               if row["toolkit"] == "seq2seq" and row.get("flops_per_sentence")}
    print("\nwhat the targets ask of the matrix units (target sent/s x our FLOP per sentence):")
    for variant, beam, times in TARGETS:
        if (variant, beam) in counted and variant in ceilings:
            needed = times * onmt_speed[beam]
            share = 100 * needed * counted[variant, beam] / (ceilings[variant] * 1e9)
            print(f"  {'greedy' if beam == 1 else f'beam{beam}'} {variant} at {times:g}x "
                  f"OpenNMT-py: {needed:.0f} sent/s = {share:.0f}% of the {variant} ceiling")
    (workdir / "results.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    print(f"written to {workdir / 'results.json'}")


if __name__ == "__main__":
    main()
