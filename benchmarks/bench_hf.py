"""Multi30k test_2016 through Hugging Face ``transformers`` on a folder made by export.py
format=huggingface, against our own translator on the checkpoint it came from (docs/export.md
quotes its figures).

    python -m benchmarks.bench_hf runs/t/checkpoints/best.pt [--threads 2] [--batch 64] \
        [--work /tmp/hf_bench_work]

Greedy and beam 5, each side batched its own way: ours by its token budget (translate.py's
4,000 padded source pieces), ``generate`` by ``--batch`` sentences of similar length (sorted,
as ours sorts), with the batch's longest limit of ``floor(1.5 n + 10)`` new pieces. Beam 5 uses
each side's own length penalty at 1.0 (GNMT's ``((5 + len) / 6)`` against ``len``). It prints
BLEU (the project's sacreBLEU) of each, the share of greedy lines with the same text, and
sentences per second (the model loaded, the timing of translation only). Then, where
``ctranslate2`` is installed and the tokenizers are joint, CTranslate2's own
``ct2-transformers-converter`` (its Python API) converts the folder, and its greedy translations
of the validation set are compared with those of our ``format=ctranslate2`` export.
"""

from __future__ import annotations

import argparse
import gzip
import os
import tempfile
import time
from pathlib import Path

import torch

# The Multi30k files: a local mirror named by SEQ2SEQ_MULTI30K_URL, else data/multi30k.
DATA = Path(os.environ.get("SEQ2SEQ_MULTI30K_URL", "data/multi30k").removeprefix("file://"))


def read(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return [line.rstrip("\n") for line in lines]


def hf_translate(model, tokenizer, sources: list[str], *, beams: int, batch: int) -> list[str]:
    """``generate`` over batches of ``batch`` sentences sorted by length; in input order."""
    order = sorted(range(len(sources)), key=lambda i: len(tokenizer(sources[i])["input_ids"]))
    texts = [""] * len(sources)
    with torch.no_grad():
        for start in range(0, len(order), batch):
            rows = order[start:start + batch]
            inputs = tokenizer([sources[i] for i in rows], return_tensors="pt", padding=True)
            limit = int(1.5 * inputs["input_ids"].shape[1] + 10)
            output = model.generate(**inputs, num_beams=beams, max_new_tokens=limit + 1,
                                    length_penalty=1.0)
            for row, text in zip(rows, tokenizer.batch_decode(output, skip_special_tokens=True),
                                 strict=True):
                texts[row] = text
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64, help="sentences a generate call")
    parser.add_argument("--work", help="folder for the export (default: a new temporary one)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(args.work or tempfile.mkdtemp(prefix="hf_bench."))
    folder = work / "hf"

    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from seq2seq.checkpoint import load_checkpoint
    from seq2seq.export import export_checkpoint
    from seq2seq.inference.decode_options import DecodeOptions
    from seq2seq.inference.runtimes import load_translator
    from seq2seq.metrics import corpus_scores

    started = time.perf_counter()
    export_checkpoint(args.checkpoint, folder, format="huggingface", overwrite=True)
    print(f"exported {folder} in {time.perf_counter() - started:.1f}s")
    state = load_checkpoint(args.checkpoint).get("trainer_state") or {}
    print(f"checkpoint: {args.checkpoint}, step {state.get('step')}, "
          f"{state.get('train_seconds', 0) / 60:.0f} minutes of training, "
          f"val BLEU {state.get('best_bleu', float('nan')):.2f}")

    sources = read(DATA / "test_2016_flickr.de.gz")
    references = read(DATA / "test_2016_flickr.en.gz")
    ours = load_translator(args.checkpoint, "cpu", max_tokens=4000)
    model = AutoModelForSeq2SeqLM.from_pretrained(str(folder)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    results = {}
    for beams in (1, 5):
        started = time.perf_counter()
        mine = [best[0].text for best in ours.translate(
            sources, DecodeOptions(beam_size=beams), return_attention=False)]
        our_seconds = time.perf_counter() - started
        started = time.perf_counter()
        theirs = hf_translate(model, tokenizer, sources, beams=beams, batch=args.batch)
        their_seconds = time.perf_counter() - started
        results[beams] = mine, theirs
        for name, texts, seconds in (("seq2seq", mine, our_seconds),
                                     ("transformers", theirs, their_seconds)):
            print(f"beam {beams} {name}: BLEU {corpus_scores(texts, references)['bleu']:.2f}, "
                  f"{len(sources) / seconds:.1f} sentences/s ({args.threads} threads)")
        same = sum(a == b for a, b in zip(mine, theirs, strict=True))
        print(f"beam {beams}: the same text in {same} of {len(sources)} lines "
              f"({100 * same / len(sources):.1f} %)")
    compare_ctranslate2(args.checkpoint, folder, work)


def compare_ctranslate2(checkpoint: str, folder: Path, work: Path) -> None:
    """ct2-transformers-converter on the folder against format=ctranslate2 on the checkpoint:
    greedy translations of the validation set, the same text or not."""
    try:
        import ctranslate2
    except ImportError:
        print("ctranslate2 is not installed: no CTranslate2 comparison")
        return
    from transformers import AutoTokenizer

    from seq2seq.checkpoint import load_checkpoint, tokenizers_from_payload
    from seq2seq.export import export_checkpoint

    tokenizers = tokenizers_from_payload(load_checkpoint(checkpoint)["tokenizers"])
    if not tokenizers.joint:
        print("separate tokenizers: ct2-transformers-converter registers one vocabulary")
        return
    ctranslate2.converters.TransformersConverter(str(folder)).convert(
        str(work / "hf-ct2"), force=True)
    export_checkpoint(checkpoint, work / "ct2", format="ctranslate2", overwrite=True)
    sources = read(DATA / "val.de.gz")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    options = {"beam_size": 1, "max_decoding_length": 256,
               "suppress_sequences": [["<pad>"], ["<s>"]]}
    texts = []
    for side, pieces in (
            ("hf-ct2", [tokenizer.convert_ids_to_tokens(tokenizer(line)["input_ids"])
                        for line in sources]),  # with </s>: the converter adds none
            ("ct2", [tokenizers.src.pieces(ids) for ids in tokenizers.src.encode(sources)])):
        translator = ctranslate2.Translator(str(work / side), device="cpu", intra_threads=2)
        results = translator.translate_batch(pieces, **options)
        texts.append(tokenizers.tgt.decode_pieces([r.hypotheses[0] for r in results]))
    same = sum(a == b for a, b in zip(*texts, strict=True))
    print(f"ct2-transformers-converter on the folder against format=ctranslate2, greedy on val: "
          f"the same text in {same} of {len(sources)} lines")


if __name__ == "__main__":
    main()
