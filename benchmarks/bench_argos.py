"""Multi30k test_2016 through an Argos Translate package made by export.py format=argos, against
translate.py on the same CTranslate2 folder (docs/export.md quotes its figures).

    python -m benchmarks.bench_argos runs/t/checkpoints/best.pt \
        [--sbd-model de.onnx] [--threads 2] [--quantize int8] [--work /tmp/argos_bleu_work]

It exports the package (languages from the checkpoint's data config: Multi30k de-en), installs
it with argos-translate-lt into a clean temporary Argos home (packages, data, cache, config),
translates test_2016_flickr.de one sentence a call through argostranslate.translate.translate
(as LibreTranslate calls it), and scores it with the project's BLEU (sacrebleu) against
test_2016_flickr.en. Argos's splitter: the package's MiniSBD model with --sbd-model, else a
stand-in that keeps each line one sentence (Multi30k has one sentence a line; offline). Then
translate.py on the exported folder: greedy, beam 4 (Argos's beam) and its defaults (beam 5).
"""

from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The Multi30k files: a local mirror named by SEQ2SEQ_MULTI30K_URL, else data/multi30k.
DATA = Path(os.environ.get("SEQ2SEQ_MULTI30K_URL", "data/multi30k").removeprefix("file://"))


def read(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return [line.rstrip("\n") for line in lines]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--sbd-model", help="a MiniSBD .onnx for the source language")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quantize", default="none", choices=["none", "int8"])
    parser.add_argument("--work", help="folder for the export and the Argos home "
                                       "(default: a new temporary one)")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="argos_bleu."))
    work.mkdir(parents=True, exist_ok=True)
    home = work / "argos-home"
    # Argos reads its folders and settings when it is imported: set them first.
    os.environ.update({"XDG_DATA_HOME": str(home / "data"), "XDG_CACHE_HOME": str(home / "cache"),
                       "XDG_CONFIG_HOME": str(home / "config"),
                       "ARGOS_PACKAGES_DIR": str(home / "packages"),
                       "ARGOS_INTRA_THREADS": str(args.threads)})

    from seq2seq.export import export_checkpoint
    from seq2seq.metrics import corpus_scores

    folder = work / "argos"
    started = time.perf_counter()
    manifest = export_checkpoint(args.checkpoint, folder, format="argos",
                                 sbd_model=args.sbd_model, quantize=args.quantize, overwrite=True)
    meta = manifest["argos"]
    package = folder / meta["package"]
    print(f"exported {package} ({package.stat().st_size / 1e6:.1f} MB) in "
          f"{time.perf_counter() - started:.1f}s")

    from argostranslate import package as argos_package
    from argostranslate import sbd, translate

    if args.sbd_model is None:
        sbd.MiniSBDSentencizer.split_sentences = lambda self, text: [text]
    argos_package.install_from_path(package)
    installed = [p.package_path.parent for p in argos_package.get_installed_packages()]
    if installed != [home / "packages"]:
        sys.exit(f"Argos installed the package elsewhere or beside others: {installed}")

    source_file = DATA / f"test_2016_flickr.{meta['from_code']}.gz"
    sources = read(source_file)
    references = read(DATA / f"test_2016_flickr.{meta['to_code']}.gz")
    translate.translate(sources[0], meta["from_code"], meta["to_code"])  # loads the model
    started = time.perf_counter()
    hypotheses = [translate.translate(line, meta["from_code"], meta["to_code"])
                  for line in sources]
    seconds = time.perf_counter() - started
    splitter = "MiniSBD " + Path(args.sbd_model).name if args.sbd_model else "one-sentence stand-in"
    print(f"Argos ({splitter}, beam 4, length_penalty 0.2, {args.threads} threads, one sentence "
          f"a call): BLEU {corpus_scores(hypotheses, references)['bleu']:.2f}, "
          f"{len(sources) / seconds:.1f} sentences/s")

    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    for options in (["beam_size=1"], ["beam_size=4"], []):
        output = work / f"translate_{'_'.join(options).replace('=', '') or 'defaults'}.txt"
        started = time.perf_counter()
        subprocess.run([sys.executable, "translate.py", f"checkpoint={folder}",
                        f"input={source_file}",
                        f"output={output}", f"num_threads={args.threads}", *options],
                       check=True, env=env)
        seconds = time.perf_counter() - started
        lines = output.read_text(encoding="utf-8").splitlines()
        print(f"translate.py {' '.join(options) or '(defaults: beam 5)'} on {folder}: BLEU "
              f"{corpus_scores(lines, references)['bleu']:.2f}, {len(sources) / seconds:.1f} "
              f"sentences/s (the whole run, start-up included); the same text as Argos's in "
              f"{sum(x == y for x, y in zip(lines, hypotheses, strict=True))} of {len(lines)}")


if __name__ == "__main__":
    main()
