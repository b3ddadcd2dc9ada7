"""The page of ``seq2seq-export format=web`` in headless Chromium: its size, load time, speed and
agreement with ``translate.py beam_size=1`` on the same folder.

    python -m benchmarks.bench_web --folder exported/t-web --src data/multi30k/test_2016_flickr.de.gz
    python -m benchmarks.bench_web --checkpoint runs/x/checkpoints/best.pt --folder exported/t-web \\
        --src data/multi30k/test_2016_flickr.de.gz --json bench/web.json

With ``--checkpoint`` the folder is exported first (``format=web``). The page is served by a
static server on 127.0.0.1 and opened in a fresh headless Chromium (an empty cache):
*first translation* is the time from asking for the page to the first sentence's translation
shown (the page loads its runtime, graphs and tokenizer first). Then every sentence of ``--src``
is translated in the page, one call a line as the page does; ``translate.py`` (the
:class:`~seq2seq.inference.translator.Translator` it builds, greedy) on the same folder gives the
reference speeds and translations, with its default batches and with one sentence a call (an
int8 graph quantizes activations per call: batch-mates can change a sentence's output). Needs Debian's
``chromium`` and ``chromium-driver`` and ``pip install selenium``.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import socketserver
import threading
import time
from pathlib import Path

from seq2seq.data.text_files import read_lines
from seq2seq.export import export_checkpoint
from seq2seq.inference.decode_options import DecodeOptions
from seq2seq.inference.runtimes import load_translator

MODEL_FILES = ("encoder.onnx", "decoder_step.onnx", "manifest.json", "source.model",
               "target.model")
TRANSLATE_ALL = """
const [lines, done] = [arguments[0], arguments[arguments.length - 1]];
const started = performance.now();
const translations = [];
for (const line of lines) translations.push(await window.seq2seqTranslator.translate(line));
done({translations, seconds: (performance.now() - started) / 1000});
"""


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def folder_sizes(folder: Path) -> dict[str, float]:
    """MB of the model's own files and of the whole folder."""
    files = [path for path in folder.rglob("*") if path.is_file()]
    own = sum(path.stat().st_size for path in files if path.name in MODEL_FILES)
    return {"model_mb": own / 1e6, "folder_mb": sum(p.stat().st_size for p in files) / 1e6}


def in_the_page(folder: Path, sources: list[str]) -> dict:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    server = socketserver.TCPServer(("127.0.0.1", 0),
                                    functools.partial(QuietHandler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    options = webdriver.ChromeOptions()
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    browser.set_script_timeout(3600)
    try:
        started = time.perf_counter()
        browser.get(f"http://127.0.0.1:{server.server_address[1]}/index.html")
        first = next(line for line in sources if line.strip())
        while browser.execute_script("return window.seq2seqReady || null") is None:
            time.sleep(0.01)
        browser.find_element(By.ID, "source").send_keys(first)
        browser.find_element(By.ID, "translate").click()
        while browser.execute_script("return window.seq2seqTranslated || null") is None:
            time.sleep(0.01)
        first_seconds = time.perf_counter() - started
        ready_seconds = browser.execute_script("return window.seq2seqReady") / 1000
        result = browser.execute_async_script(TRANSLATE_ALL, sources)
    finally:
        browser.quit()
        server.shutdown()
    return {"ready_seconds": ready_seconds, "first_translation_seconds": first_seconds,
            "page_seconds": result["seconds"], "translations": result["translations"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", required=True, type=Path, help="the page's folder")
    parser.add_argument("--checkpoint", help="export this checkpoint to --folder first")
    parser.add_argument("--src", required=True, type=Path, help="source sentences, one a line")
    parser.add_argument("--max-sentences", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    if args.checkpoint:
        export_checkpoint(args.checkpoint, args.folder, format="web", overwrite=True)
    sources = read_lines(args.src)[: args.max_sentences]
    page = in_the_page(args.folder, sources)
    shown = page.pop("translations")
    translator = load_translator(args.folder)
    greedy = DecodeOptions(beam_size=1)
    translator.translate(sources[:8], greedy)  # warm-up, as the page's first sentence
    report = {"folder": str(args.folder), "sentences": len(sources), **folder_sizes(args.folder),
              **page, "page_sentences_per_second": len(sources) / page["page_seconds"]}
    # translate.py's batches, then one sentence a call as the page translates: an int8 graph
    # quantizes its activations per call, so a sentence's batch-mates can change its output.
    for name, batches in (("batched", [sources]), ("alone", [[line] for line in sources])):
        started = time.perf_counter()
        expected = [n_best[0].text for batch in batches
                    for n_best in translator.translate(batch, greedy)]
        speed = len(sources) / (time.perf_counter() - started)
        differing = [number + 1 for number, (ours, theirs)
                     in enumerate(zip(shown, expected, strict=True)) if ours != theirs]
        report[f"translate_py_{name}"] = {
            "sentences_per_second": speed,
            "page_speed_share": report["page_sentences_per_second"] / speed,
            "same_translations": 1 - len(differing) / len(sources),
            "differing_lines": differing}
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
