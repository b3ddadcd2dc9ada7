"""``seq2seq-export format=web``: the page translates in a real headless Chromium (Selenium) as
``translate.py beam_size=1`` does on the same folder, served by a static server on 127.0.0.1.

Needs Debian's ``chromium`` and ``chromium-driver``, ``pip install selenium`` and the page's npm
packages (``npm ci --prefix web``, which ``make install`` runs); skipped, with the reason, where
any is missing. ``SEQ2SEQ_SCREENSHOT=docs/web_page.png`` saves the page after a translation
there (how the docs' picture is made); every run saves one in its temporary folder.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import socketserver
import threading
import time
from pathlib import Path

import pytest
from conftest import skip_without_a_browser, transformer_checkpoint

from seq2seq.export import ExportError, export_checkpoint
from seq2seq.export.web import runtime_folder, write_page
from seq2seq.inference.decode_options import DecodeOptions
from seq2seq.inference.runtimes import load_translator

# A line of each kind: plain, empty, repeated words, one past the output limit's reach, and
# characters the copy model never saw.
LINES = ["red cat big house", "", "blue bird sun", "green dog " * 30, "Zwei Männer, ein Hund."]

pytest.importorskip("onnxruntime", reason="exporting needs `pip install .[export]`")
skip_without_a_browser()
try:
    runtime_folder()
except ExportError as error:
    pytest.skip(str(error), allow_module_level=True)

pytestmark = pytest.mark.slow


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def pages(exported_copy_model, tmp_path_factory) -> dict[str, Path]:
    """A random Transformer exported with format=web, and the trained copy model (a GRU with
    attention) as the session's ONNX export of it with the page added (write_page): an RNN
    export costs ten times a Transformer's."""
    folder = tmp_path_factory.mktemp("web")
    export_checkpoint(transformer_checkpoint(folder), folder / "transformer", format="web")
    write_page(exported_copy_model, folder / "gru")
    return {name: folder / name for name in ("gru", "transformer")}


def serve(folder: Path) -> tuple[str, socketserver.TCPServer]:
    """A static server of ``folder`` on a free loopback port, as ``python -m http.server``."""
    server = socketserver.TCPServer(("127.0.0.1", 0),
                                    functools.partial(QuietHandler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server


def wait_for(browser, script: str, seconds: float = 60):
    deadline = time.monotonic() + seconds
    while (value := browser.execute_script(script)) is None:
        assert time.monotonic() < deadline, f"the page did not answer {script!r}"
        time.sleep(0.05)
    return value


@pytest.mark.parametrize("family", ["gru", "transformer"])
def test_the_page_translates_as_translate_py_greedy_on_the_same_folder(pages, browser, family,
                                                                      tmp_path):
    from selenium.webdriver.common.by import By

    folder = pages[family]
    # One sentence a call, as the page translates: an int8 graph quantizes its activations per
    # call, so batch-mates may change a translation (docs/export.md#in-the-browser).
    translator = load_translator(folder)
    expected = [translator.translate([line], DecodeOptions(beam_size=1))[0][0].text
                for line in LINES]
    url, server = serve(folder)
    try:
        browser.get(f"{url}/index.html")
        ready = wait_for(browser, "return window.seq2seqReady || window.seq2seqError || null")
        assert isinstance(ready, int | float), ready  # else the error the page shows
        browser.find_element(By.ID, "source").send_keys("\n".join(LINES))
        browser.find_element(By.ID, "translate").click()
        wait_for(browser, "return window.seq2seqTranslated || null")
        shown = browser.find_element(By.ID, "output").get_attribute("value").split("\n")
        # Everything the page fetched came from the folder's own server.
        fetched = browser.execute_script(
            "return performance.getEntriesByType('resource').map(entry => entry.name)")
        text = browser.find_element(By.TAG_NAME, "body").text
        browser.save_screenshot(str(tmp_path / f"{family}.png"))
        if family == "gru" and os.environ.get("SEQ2SEQ_SCREENSHOT"):
            browser.save_screenshot(os.environ["SEQ2SEQ_SCREENSHOT"])
    finally:
        server.shutdown()
        server.server_close()
    # The trained model exactly; the random one's pieces are near-ties at times, which the
    # WebAssembly kernels' rounding may break the other way than this CPU's (about 0.3 % of a
    # trained model's test sentences, docs/export.md#in-the-browser).
    same = sum(ours == theirs for ours, theirs in zip(shown, expected, strict=True))
    assert same == len(LINES) if family == "gru" else same >= len(LINES) - 1, (shown, expected)
    assert fetched and all(name.startswith(f"{url}/") for name in fetched), fetched
    assert "nothing you type leaves it" in text
    assert "src → tgt" in text  # the copy corpus' placeholder codes, from the manifest
    assert (tmp_path / f"{family}.png").read_bytes().startswith(b"\x89PNG")


def test_the_folder_is_an_onnx_export_with_the_page_beside_it(pages):
    folder = pages["transformer"]
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["format"] == "seq2seq-onnx" and manifest["export"]["quantize"] == "int8"
    assert manifest["export"]["int8_embeddings"] is True
    assert manifest["web"]["user_symbols"] == {}
    for name in ("index.html", "page.mjs", "translator.mjs", "shims/fs.mjs", "shims/buffer.mjs",
                 "runtime/ort.wasm.min.mjs", "runtime/ort-wasm-simd-threaded.wasm",
                 "runtime/sentencepiece.mjs"):
        assert (folder / name).is_file(), name
    # The page's own files name nothing outside the folder (the browser test checks what the
    # runtime fetches).
    for path in (*folder.glob("*.html"), *folder.glob("*.mjs"), *folder.glob("shims/*")):
        text = path.read_text(encoding="utf-8")
        assert "http:" not in text and "https:" not in text and "//cdn" not in text, path


def test_what_format_web_cannot_do_is_refused_in_one_line(trained_checkpoint, pages, tmp_path,
                                                          monkeypatch):
    from seq2seq.checkpoint import CheckpointError

    with pytest.raises(ExportError, match="^format=web takes no option quantize: its graphs "
                                          "are int8"):
        export_checkpoint(trained_checkpoint, tmp_path / "page", format="web", quantize="int8")
    with pytest.raises(ExportError, match="already exists: give overwrite=true"):
        export_checkpoint(trained_checkpoint, pages["gru"], format="web")
    with pytest.raises(CheckpointError, match="not found"):
        export_checkpoint(tmp_path / "missing.pt", tmp_path / "page", format="web")
    monkeypatch.setenv("SEQ2SEQ_WEB_RUNTIME", str(tmp_path / "nowhere"))
    with pytest.raises(ExportError, match="npm ci --prefix web") as raised:
        export_checkpoint(trained_checkpoint, tmp_path / "page", format="web")
    assert "\n" not in str(raised.value)
    assert not (tmp_path / "page").exists()
