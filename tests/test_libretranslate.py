"""LibreTranslate's API on the server (seq2seq.serving.libretranslate): its shapes, its errors,
and its answers, which must be /v1/translate's for the same sentences.

The client test runs the app under uvicorn on 127.0.0.1 (a thread of this process, stopped at
the end) and calls it with ``libretranslatepy``, a client written for LibreTranslate, not here;
the others drive the app in-process through FastAPI's test client. Every expected translation is
the server's own /v1/translate answer, never a string a model is expected to produce.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="serving needs `pip install .[serve]` (FastAPI)")
pytest.importorskip("httpx", reason="FastAPI's test client needs httpx")
pytest.importorskip("multipart", reason="form posts need python-multipart (the serve extra)")
from fastapi.testclient import TestClient  # noqa: E402

from seq2seq.checkpoint import LANGUAGE_NAMES  # noqa: E402
from seq2seq.inference.decode_options import DecodeOptions  # noqa: E402
from seq2seq.serving.app import create_app  # noqa: E402
from seq2seq.serving.libretranslate import NO_LANGUAGES  # noqa: E402
from seq2seq.serving.models import ServedModel, load_model  # noqa: E402

LINES = ["red cat", "one two big house", "blue bird sun", "moon", "small tree green dog"]
HANG = 30  # seconds: a bounded wait fails only when something hangs


@pytest.fixture(scope="module")
def translator(trained_checkpoint) -> ServedModel:
    """The copy model, served at beam 3 unless a request says otherwise."""
    return load_model(trained_checkpoint, device="cpu", options=DecodeOptions(beam_size=3))


@pytest.fixture
def client(translator):
    app = create_app({"copy": translator}, max_lines=8, max_chars=200,
                     languages={"copy": ("de", "en")})
    with TestClient(app) as test_client:
        yield test_client


def v1_translations(client, texts: list[str], **options) -> list[list[str]]:
    """/v1/translate's hypotheses for ``texts``, best first."""
    response = client.post("/v1/translate", json={"text": texts, **options})
    assert response.status_code == 200, response.text
    return [[h["text"] for h in entry["hypotheses"]] for entry in response.json()["translations"]]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def live_server(app):
    """``app`` under uvicorn on 127.0.0.1 in a thread; yields its URL; stops it on leaving."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + HANG
        while not server.started:
            assert thread.is_alive(), "uvicorn stopped before serving"
            assert time.monotonic() < deadline, f"uvicorn did not start in {HANG} s"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(HANG)
        assert not thread.is_alive(), f"uvicorn did not stop in {HANG} s"


def test_the_libretranslatepy_client_gets_what_v1_translate_gives(translator):
    from libretranslatepy import LibreTranslateAPI

    app = create_app({"copy": translator}, languages={"copy": ("de", "en")})
    with live_server(app) as url:
        request = urllib.request.Request(
            f"{url}/v1/translate", data=json.dumps({"text": LINES}).encode(),
            headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=HANG) as response:
            expected = [t["text"] for t in json.load(response)["translations"]]
        client = LibreTranslateAPI(url, api_key="any key")  # accepted, not checked
        assert [client.translate(line, "de", "en", timeout=HANG) for line in LINES] == expected
        assert client.translate(LINES[0], "auto", "en", timeout=HANG) == expected[0]
        assert client.detect("red cat", timeout=HANG) == [{"confidence": 100.0, "language": "de"}]
        assert client.languages(timeout=HANG) == [
            {"code": "de", "name": "German", "targets": ["en"]},
            {"code": "en", "name": "English", "targets": []}]
        with pytest.raises(urllib.error.HTTPError) as refused:
            client.translate("red cat", "fr", "en", timeout=HANG)
        assert refused.value.code == 400
        assert json.load(refused.value) == {
            "error": "fr->en is not served; this server translates de->en"}


def test_json_and_form_posts_a_list_and_alternatives(client):
    expected = v1_translations(client, LINES)
    for line, want in zip(LINES, expected, strict=True):
        as_json = client.post("/translate", json={"q": line, "source": "de", "target": "en"})
        as_form = client.post("/translate", data={"q": line, "source": "de", "target": "en",
                                                  "format": "text", "api_key": "x"})
        assert as_json.json() == as_form.json() == {"translatedText": want[0]}
    listed = client.post("/translate", json={"q": LINES, "source": "de", "target": "en"})
    assert listed.json() == {"translatedText": [want[0] for want in expected]}

    # alternatives: /v1/translate's other hypotheses (nbest alternatives + 1), each once, never
    # empty or the best itself; the best is the one of /v1/translate with that nbest.
    wider = v1_translations(client, LINES, nbest=3)
    others = [[t for t in dict.fromkeys(want[1:]) if t and t != want[0]] for want in wider]
    assert any(others)
    body = client.post("/translate", json={"q": LINES, "source": "de", "target": "en",
                                           "alternatives": 2}).json()
    assert body == {"translatedText": [want[0] for want in wider], "alternatives": others}
    single = client.post("/translate", data={"q": LINES[0], "source": "de", "target": "en",
                                             "alternatives": "2"}).json()
    assert single == {"translatedText": wider[0][0], "alternatives": others[0]}


def test_auto_and_detect_name_the_one_source_language(client):
    expected = v1_translations(client, LINES[:2])
    detected = {"confidence": 100.0, "language": "de"}
    one = client.post("/translate", json={"q": LINES[0], "source": "auto", "target": "en"})
    assert one.json() == {"translatedText": expected[0][0], "detectedLanguage": detected}
    both = client.post("/translate", data={"q": LINES[1], "source": "auto", "target": "en"})
    assert both.json()["translatedText"] == expected[1][0]
    listed = client.post("/translate", json={"q": LINES[:2], "source": "auto", "target": "en"})
    assert listed.json()["detectedLanguage"] == [detected, detected]
    assert client.post("/detect", json={"q": "red cat"}).json() == [detected]
    assert client.post("/detect", data={"q": "red cat"}).json() == [detected]


def test_several_models_each_serve_their_pair(translator, make_checkpoint, tmp_path):
    other = load_model(make_checkpoint(tmp_path), device="cpu", options=DecodeOptions(beam_size=2))
    app = create_app({"de-en": translator, "fr-en": other, "unknown": other},
                     languages={"de-en": ("de", "en"), "fr-en": ("fr", "en")})
    with TestClient(app) as client:
        assert client.get("/languages").json() == [
            {"code": "de", "name": "German", "targets": ["en"]},
            {"code": "en", "name": "English", "targets": []},
            {"code": "fr", "name": "French", "targets": ["en"]}]
        for model, source in (("de-en", "de"), ("fr-en", "fr")):
            body = client.post("/translate", json={"q": LINES, "source": source, "target": "en"})
            assert body.json()["translatedText"] == [
                want[0] for want in v1_translations(client, LINES, model=model)]
        message = ("cannot detect the language: this server has no detector and serves several "
                   "sources (de, fr): name the source")
        for response in (
            client.post("/translate", json={"q": "red cat", "source": "auto", "target": "en"}),
            client.post("/detect", data={"q": "red cat"}),
        ):
            assert (response.status_code, response.json()) == (400, {"error": message})
        refused = client.post("/translate", json={"q": "red", "source": "en", "target": "de"})
        assert refused.json() == {
            "error": "en->de is not served; this server translates de->en, fr->en"}


@pytest.mark.parametrize(("fields", "message"), [
    ({"q": "red", "source": "de", "target": "en", "format": "html"},
     "format 'html' is not supported: this server translates plain text (format=text)"),
    ({"q": "red", "source": "de", "target": "en", "format": "markdown"},
     "format 'markdown' is not supported: this server translates plain text (format=text)"),
    ({"source": "de", "target": "en"}, "missing q: the text to translate"),
    ({"q": "", "source": "de", "target": "en"}, "missing q: the text to translate"),
    ({"q": "red", "target": "en"},
     "missing source: a language code (GET /languages lists them)"),
    ({"q": "red", "source": "de"},
     "missing target: a language code (GET /languages lists them)"),
    ({"q": "red", "source": "de", "target": "en", "alternatives": "many"},
     "alternatives: 'many' is not a whole number"),
    ({"q": "red", "source": "de", "target": "fr"},
     "de->fr is not served; this server translates de->en"),
])
def test_bad_requests_are_400_with_one_line(client, fields, message):
    for response in (client.post("/translate", json=fields),
                     client.post("/translate", data=fields)):
        assert response.status_code == 400, response.text
        assert response.json() == {"error": message}


@pytest.mark.parametrize(("body", "message"), [
    ({"q": ["red", 3], "source": "de", "target": "en"}, "q: a string or a list of strings"),
    ({"q": "red", "source": "de", "target": "en", "alternatives": [1]},
     "alternatives: [1] is not a whole number"),
    ({"q": "red", "source": "de", "target": "en", "alternatives": True},
     "alternatives: True is not a whole number"),
    ({"q": "red", "source": "de", "target": "en", "alternatives": 2.9},
     "alternatives: 2.9 is not a whole number"),
    (["red"], "invalid JSON: the body must be an object"),
])
def test_bad_json_is_400_with_one_line(client, body, message):
    response = client.post("/translate", json=body)
    assert (response.status_code, response.json()) == (400, {"error": message})
    broken = client.post("/translate", content=b'{"q": "red"',
                         headers={"content-type": "application/json"})
    assert broken.status_code == 400 and broken.json()["error"].startswith("invalid JSON: ")


def test_the_limits_of_v1_translate_apply(client):
    """The same limits and messages as /v1/translate (max_lines 8, max_chars 200 here); more
    alternatives than the model's beam widen it, more than the largest beam are refused."""
    for texts in (["red"] * 9, ["red cat " * 30]):
        v1 = client.post("/v1/translate", json={"text": texts})
        ours = client.post("/translate", json={"q": texts, "source": "de", "target": "en"})
        assert v1.status_code == ours.status_code == 413
        assert ours.json() == v1.json()
    v1 = client.post("/v1/translate", json={"text": ["red"], "nbest": 4})  # beam_size 3
    assert (v1.status_code, v1.json()) == (422, {
        "error": "nbest must be between 1 and beam_size (3), got 4"})
    # More alternatives than the beam holds widen the beam, as Argos Translate does.
    ours = client.post("/translate", json={"q": "red", "source": "de", "target": "en",
                                           "alternatives": 3})
    assert ours.status_code == 200, ours.text
    wider = v1_translations(client, ["red"], beam_size=4, nbest=4)[0]
    assert ours.json() == {"translatedText": wider[0], "alternatives": [
        t for t in dict.fromkeys(wider[1:]) if t and t != wider[0]]}
    # Past the server's largest beam (16), the refusal names the option the client sent.
    too_many = client.post("/translate", json={"q": "red", "source": "de", "target": "en",
                                               "alternatives": 16})
    assert (too_many.status_code, too_many.json()) == (
        400, {"error": "alternatives: at most 15, got 16"})
    assert client.post("/translate", json={"q": "red", "source": "de", "target": "en"}).json()[
        "translatedText"] == v1_translations(client, ["red"])[0][0]  # serving on as before


def test_a_form_of_cjk_text_meets_the_character_limit_not_the_body_limit(translator):
    """A form percent-encodes each CJK character as 9 bytes: a text over max_chars is refused
    for its characters (the message a client can act on), not for the body's size."""
    app = create_app({"copy": translator}, max_lines=1, max_chars=2000,
                     languages={"copy": ("de", "en")})
    with TestClient(app) as client:
        response = client.post("/translate", data={"q": "\u6f22" * 2001, "source": "de",
                                                   "target": "en"})
    assert (response.status_code, response.json()) == (
        413, {"error": "2001 characters: at most 2000 per request"})


def test_a_server_that_knows_no_languages_says_how_to_give_them(translator):
    with TestClient(create_app({"copy": translator})) as client:
        for response in (
            client.post("/translate", json={"q": "red", "source": "de", "target": "en"}),
            client.post("/translate", json={"q": "red", "source": "auto", "target": "en"}),
            client.post("/detect", json={"q": "red"}),
            client.get("/languages"),
        ):
            assert (response.status_code, response.json()) == (400, {"error": NO_LANGUAGES})


def serve_config(checkpoint: Path, *overrides: str):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from seq2seq import CONFIG_DIR

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return compose(config_name="serve", overrides=[
                f"checkpoint={checkpoint}", "name=copy", "device=cpu", *overrides])
    finally:
        GlobalHydra.instance().clear()


def test_serve_py_takes_the_languages_the_checkpoint_records_else_its_own(
        trained_checkpoint, tmp_path, capsys):
    from seq2seq.checkpoint import load_checkpoint, save_checkpoint
    from seq2seq.cli.serve import build_app
    from seq2seq.serving.models import load_model

    # The copy model's checkpoint names its sides as a files corpus does unless told: src, tgt.
    assert load_model(trained_checkpoint).languages is None
    multi30k = load_checkpoint(trained_checkpoint)
    multi30k["config"]["data"] = {"kind": "multi30k", "src_lang": "fr", "tgt_lang": "cs"}
    recorded = tmp_path / "fr-cs.pt"
    save_checkpoint(multi30k, recorded)
    assert load_model(recorded).languages == load_model([recorded, trained_checkpoint]).languages \
        == ("fr", "cs")

    pairs = {(recorded, ()): ("fr", "cs"),  # src_lang/tgt_lang only where none is recorded
             (recorded, ("src_lang=de", "tgt_lang=en")): ("fr", "cs"),
             (trained_checkpoint, ("src_lang=de", "tgt_lang=en")): ("de", "en")}
    for (checkpoint, overrides), (source, target) in pairs.items():
        with TestClient(build_app(serve_config(checkpoint, *overrides))) as client:
            assert client.get("/languages").json()[0] == {
                "code": source, "name": LANGUAGE_NAMES[source], "targets": [target]}
            body = client.post("/translate", data={"q": "red cat", "source": source,
                                                   "target": target}).json()
            assert body == {"translatedText": v1_translations(client, ["red cat"])[0][0]}
    with TestClient(build_app(serve_config(trained_checkpoint))) as client:
        assert client.get("/languages").json() == {"error": NO_LANGUAGES}

    for overrides, message in ((("src_lang=de",), "give both src_lang and tgt_lang, or neither"),
                               (("src_lang=auto", "tgt_lang=en"),
                                "'auto' is no language code: LibreTranslate's clients ask the "
                                "server to detect with it")):
        with pytest.raises(SystemExit):
            build_app(serve_config(trained_checkpoint, *overrides))
        assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: {message}"
