"""The page of seq2seq-serve in a real headless Chromium, driven by Selenium.

Needs Debian's ``chromium`` and ``chromium-driver`` packages and ``pip install selenium``;
skipped (with the reason) where any is missing. Three models are served by ``serve.py`` as a
real process: the trained copy model (additive attention), one with general (bilinear)
attention and random weights (trained like the first when a screenshot is asked for) and a
random Transformer, so the page shows them side by side, the Transformer with its layer and
head picker. The page must show what the Translator gives for each checkpoint.
``SEQ2SEQ_SCREENSHOT=docs/serve.png`` saves a screenshot of the page (how docs/serve.png is made).
"""

from __future__ import annotations

import os
import signal
import socket
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import skip_without_a_browser, transformer_checkpoint

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = ["red cat big house", "blue bird sun"]

pytest.importorskip("fastapi", reason="serving needs `pip install .[serve]` (FastAPI)")
skip_without_a_browser()

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def server(trained_checkpoint, make_checkpoint, tmp_path, run_python):
    """``serve.py`` with two models on a free loopback port; yields its URL."""
    # The page needs a second model, not a good one; the screenshot shows a trained one.
    steps = 300 if os.environ.get("SEQ2SEQ_SCREENSHOT") else 0
    general = make_checkpoint(tmp_path / "general", train_steps=steps, attention="general")
    (tmp_path / "transformer").mkdir()
    transformer = transformer_checkpoint(tmp_path / "transformer")
    port = free_port()
    process = run_python.start(
        [ROOT / "serve.py", f"port={port}", "device=cpu", "num_threads=1",
         f"models={{additive: '{trained_checkpoint}', general: '{general}', "
         f"transformer: '{transformer}'}}"],
        cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None, process.result().stderr
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1):
                break
        except OSError:
            assert time.monotonic() < deadline, "the server did not start in 60 s"
            time.sleep(0.2)
    yield url, transformer
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=30)
    process.result()


def test_page_translates_and_draws_interactive_attention(server, browser, trained_checkpoint):
    server, transformer = server
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    from seq2seq.inference.decode_options import DecodeOptions
    from seq2seq.inference.runtimes import load_translator

    translator = load_translator(trained_checkpoint)
    (expected,) = translator.translate(SENTENCES[:1], DecodeOptions(beam_size=3))[0]
    rows = len(expected.target_pieces) + 1  # and </s>

    wait = WebDriverWait(browser, 30)
    browser.get(server)
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#model option")) == 4)
    assert Select(browser.find_element(By.ID, "model")).first_selected_option.text.startswith("all")
    box = browser.find_element(By.ID, "text")
    box.clear()
    box.send_keys("\n".join(SENTENCES))
    beam = browser.find_element(By.ID, "beam")
    beam.clear()
    beam.send_keys("3")
    browser.find_element(By.ID, "translate").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".panel")) == 6)

    sections = browser.find_elements(By.CSS_SELECTOR, "section.sentence")
    assert len(sections) == 2
    panels = sections[0].find_elements(By.CSS_SELECTOR, ".panel")
    assert [p.get_attribute("data-model") for p in panels] == ["additive", "general",
                                                                "transformer"]
    # Only the Transformer has layers and heads to pick from.
    assert [bool(p.find_elements(By.CSS_SELECTOR, ".picker")) for p in panels] == [
        False, False, True]
    additive = panels[0]
    assert additive.find_element(By.CSS_SELECTOR, ".translation").text == expected.text
    cells = additive.find_elements(By.CSS_SELECTOR, "td.cell")
    sources = additive.find_elements(By.CSS_SELECTOR, "th.src")
    targets = additive.find_elements(By.CSS_SELECTOR, "th.tgt")
    assert len(sources) == 5  # four pieces and </s>
    assert len(targets) == rows and len(cells) == rows * 5
    assert panels[1].find_elements(By.CSS_SELECTOR, "td.cell")  # the second model's matrix

    # A cell: its row and column light up, its weight is shown.
    row = min(1, rows - 1)
    cell = cells[row * 5 + 1]
    ActionChains(browser).move_to_element(cell).perform()
    wait.until(lambda d: "hl" in targets[row].get_attribute("class"))
    assert "hl" in sources[1].get_attribute("class")
    info = additive.find_element(By.CSS_SELECTOR, ".info").text
    assert info.endswith(cell.get_attribute("data-weight")), info
    # A target piece: the source pieces are shaded by its weights.
    ActionChains(browser).move_to_element(targets[0]).perform()
    wait.until(lambda d: "attends to" in additive.find_element(By.CSS_SELECTOR, ".info").text)
    assert sources[0].value_of_css_property("background-color") != "rgba(0, 0, 0, 0)"
    # A source piece: the target pieces are shaded.
    ActionChains(browser).move_to_element(sources[2]).perform()
    wait.until(lambda d: "attended by" in additive.find_element(By.CSS_SELECTOR, ".info").text)

    check_head_picker(panels[2], transformer, Select)

    ActionChains(browser).move_to_element(cells[(rows - 1) * 5 + 2]).perform()
    screenshot = os.environ.get("SEQ2SEQ_SCREENSHOT")
    if screenshot:
        browser.execute_script("window.scrollTo(0, 0)")
        browser.save_screenshot(screenshot)


def check_head_picker(panel, checkpoint, Select) -> None:
    """The picker's layer 2, head 1 matrix is that of the Translator's attention_heads, and
    "mean" of both gives back the averaged matrix."""
    from selenium.webdriver.common.by import By

    from seq2seq.inference.decode_options import DecodeOptions
    from seq2seq.inference.runtimes import load_translator

    translator = load_translator(checkpoint)
    (expected,) = translator.translate(SENTENCES[:1], DecodeOptions(beam_size=3),
                                       attention_heads=True)[0]
    heads = expected.attention_heads  # (L, H, T + 1, S + 1)
    assert panel.find_element(By.CSS_SELECTOR, ".translation").text == expected.text

    def weights():
        return [float(c.get_attribute("data-weight"))
                for c in panel.find_elements(By.CSS_SELECTOR, "td.cell")]

    averaged = weights()
    assert averaged == pytest.approx(expected.attention.flatten().tolist(), abs=2e-4)
    layer = Select(panel.find_element(By.CSS_SELECTOR, "select.layer"))
    head = Select(panel.find_element(By.CSS_SELECTOR, "select.head"))
    assert [o.text for o in layer.options] == ["mean", "1", "2"]
    assert [o.text for o in head.options] == ["mean", "1", "2"]
    layer.select_by_visible_text("2")
    head.select_by_visible_text("1")
    assert weights() == pytest.approx(heads[1, 0].flatten().tolist(), abs=2e-4)
    assert weights() != pytest.approx(averaged, abs=2e-4)
    layer.select_by_visible_text("mean")
    head.select_by_visible_text("mean")
    assert weights() == pytest.approx(averaged, abs=5e-4)
