"""The translation API (seq2seq.serving): answers, errors, dynamic batching, graceful shutdown.

The API tests run the app in-process through FastAPI's test client; the shutdown test runs
``serve.py`` as a real uvicorn process on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="serving needs `pip install .[serve]` (FastAPI)")
pytest.importorskip("httpx", reason="FastAPI's test client needs httpx")
from fastapi.testclient import TestClient  # noqa: E402

from seq2seq.inference.translator import Translator  # noqa: E402
from seq2seq.serving.app import create_app  # noqa: E402
from seq2seq.serving.batcher import BatcherClosed, DynamicBatcher  # noqa: E402
from seq2seq.serving.models import load_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
LINES = ["red cat", "", "one two big house", "blue bird sun", "moon", "small tree green dog"]


@pytest.fixture(scope="module")
def translator(trained_checkpoint) -> Translator:
    return Translator.from_checkpoint(trained_checkpoint, device="cpu", beam_size=3)


@pytest.fixture
def client(translator):
    app = create_app({"copy": translator}, max_lines=8, max_chars=200, max_beam_size=6)
    with TestClient(app) as test_client:
        yield test_client


def translate(client, text, **options):
    return client.post("/v1/translate", json={"text": text, **options})


def test_translations_equal_translate_py(client, trained_checkpoint, tmp_path, run_python):
    result = run_python(
        [ROOT / "translate.py", f"checkpoint={trained_checkpoint}", "beam_size=3", "nbest=2",
         "device=cpu"],
        input="".join(f"{line}\n" for line in LINES), cwd=tmp_path, env=ENV, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    expected = [line.split("\t") for line in result.stdout.splitlines()]
    response = translate(client, LINES, beam_size=3, nbest=2)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["model"], body["beam_size"], body["nbest"]) == ("copy", 3, 2)
    assert len(body["translations"]) == len(LINES)
    for index, entry in enumerate(body["translations"]):
        got = [(f"{h['score']:.4f}", h["text"]) for h in entry["hypotheses"]]
        assert got == [tuple(pair) for pair in expected[2 * index : 2 * index + len(got)]]
        assert (entry["text"], entry["score"]) == (entry["hypotheses"][0]["text"],
                                                   entry["hypotheses"][0]["score"])
    assert body["translations"][0]["text"] == "red cat"
    # The server's defaults (beam 3, nbest 1) give translate.py's best lines.
    default = translate(client, LINES).json()
    assert default["nbest"] == 1
    assert [t["text"] for t in default["translations"]] == [e[1] for e in expected[::2]]


def test_attention_pieces_and_weights(client):
    body = translate(client, ["green dog", ""], attention=True).json()
    first, empty = body["translations"]
    best = first["hypotheses"][0]
    assert first["source_pieces"] == ["▁green", "▁dog"]
    assert best["target_pieces"] == ["▁green", "▁dog"]
    weights = best["attention"]
    assert len(weights) == len(best["target_pieces"]) + 1
    assert all(len(row) == len(first["source_pieces"]) + 1 for row in weights)
    assert all(abs(sum(row) - 1) < 1e-2 for row in weights)
    assert empty["text"] == "" and empty["source_pieces"] == []
    assert empty["hypotheses"][0]["attention"] is None
    without = translate(client, ["green dog"]).json()["translations"][0]
    assert "source_pieces" not in without and "attention" not in without["hypotheses"][0]


def test_empty_inputs(client):
    assert translate(client, []).json()["translations"] == []
    body = translate(client, [""]).json()
    assert [(t["text"], t["score"]) for t in body["translations"]] == [("", 0.0)]


@pytest.mark.parametrize(
    ("payload", "status"),
    [
        ({"text": ["red"] * 9}, 413),  # max_lines 8
        ({"text": ["red cat " * 30]}, 413),  # 240 characters > max_chars 200
        ({"text": ["red"], "model": "nope"}, 404),
        ({"text": "red cat"}, 422),  # not a list
        ({"text": ["red", 3]}, 422),
        ({"text": ["red"], "beam_size": "wide"}, 422),
        ({"text": ["red"], "beam_size": 0}, 422),
        ({"text": ["red"], "beam_size": 7}, 422),  # max_beam_size 6
        ({"text": ["red"], "beam_size": 2, "nbest": 3}, 422),
        ({"text": ["red"], "attention": "maybe"}, 422),
        ({"text": ["red"], "checkpoint": "/etc/passwd"}, 422),  # clients never name files
        ({}, 422),
    ],
)
def test_errors_are_json_and_harmless(client, payload, status):
    response = client.post("/v1/translate", json=payload)
    assert response.status_code == status, response.text
    assert isinstance(response.json()["error"], str) and response.json()["error"]
    assert translate(client, ["red cat"]).json()["translations"][0]["text"] == "red cat"


def test_malformed_json_and_oversized_body(client):
    response = client.post("/v1/translate", content=b'{"text": ["red"',
                           headers={"content-type": "application/json"})
    assert response.status_code == 422 and "error" in response.json()
    huge = json.dumps({"text": ["x" * 10_000]})
    assert client.post("/v1/translate", content=huge,
                       headers={"content-type": "application/json"}).status_code == 413
    assert translate(client, ["moon"]).status_code == 200


def test_models_health_openapi_and_page(client):
    models = client.get("/v1/models").json()
    assert models["default"] == "copy"
    (info,) = models["models"]
    assert info["name"] == "copy" and info["scorer"] == "AdditiveScorer"
    assert info["parameters"] > 1000 and info["defaults"]["beam_size"] == 3
    assert client.get("/health").json() == {"status": "ok", "models": ["copy"]}
    schema = client.get("/openapi.json").json()
    assert {"/v1/translate", "/v1/models", "/health"} <= set(schema["paths"])
    assert "TranslateRequest" in schema["components"]["schemas"]
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "http://" not in page.text and "https://" not in page.text  # nothing from a CDN


def test_load_model_reads_the_checkpoint(trained_checkpoint):
    served = load_model(trained_checkpoint, device="cpu", beam_size=2)
    assert served.scorer == "AdditiveScorer" and served.parameters > 1000
    assert served.translator.beam_size == 2


def test_concurrent_requests_share_batches_and_get_their_own_answers(translator, copy_sentences):
    inputs = [[s] for s in copy_sentences(40, seed=7)] + [copy_sentences(3, seed=8)]
    options = [{"beam_size": 1 + i % 3, "attention": i % 2 == 0} for i in range(len(inputs))]
    expected = [
        [n[0].text for n in Translator.translate(translator, text, return_attention=False)]
        for text in inputs
    ]  # the same as each request alone: a translation does not depend on its batch
    app = create_app({"copy": translator}, window_ms=50)
    with TestClient(app) as client, ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(translate, client, text, **option)
                   for text, option in zip(inputs, options, strict=True)]
        responses = [future.result() for future in futures]
        batcher = app.state.batchers["copy"]
        assert batcher.largest_round > 1 and batcher.rounds < len(inputs)
    for response, want in zip(responses, expected, strict=True):
        assert response.status_code == 200
        assert [t["text"] for t in response.json()["translations"]] == want


class FakeTranslator:
    """Upper-cases; sleeps on "slow", fails on "boom"."""

    beam_size = nbest = 1

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def translate(self, sentences, *, return_attention=False):
        self.calls.append(list(sentences))
        if "boom" in sentences:
            raise RuntimeError("boom")
        if "slow" in sentences:
            time.sleep(0.3)
        return [[type("T", (), {"text": s.upper()})()] for s in sentences]


def test_batcher_survives_failures_and_cancelled_requests():
    async def scenario():
        fake = FakeTranslator()
        batcher = DynamicBatcher(fake, window_ms=1, name="fake")
        slow = asyncio.ensure_future(batcher.submit(["slow"], beam_size=1, nbest=1,
                                                    attention=False))
        await asyncio.sleep(0.05)  # the worker is now decoding "slow"
        gone = asyncio.ensure_future(batcher.submit(["gone"], beam_size=1, nbest=1,
                                                    attention=False))
        await asyncio.sleep(0.01)
        gone.cancel()  # a client that disconnected
        with pytest.raises(RuntimeError, match="boom"):
            await batcher.submit(["boom"], beam_size=1, nbest=1, attention=False)
        results = await asyncio.gather(
            slow, *(batcher.submit([f"s{i}", "x"], beam_size=1, nbest=1, attention=False)
                    for i in range(5)))
        assert [r[0].text for r in results[0]] == ["SLOW"]
        assert [[n[0].text for n in r] for r in results[1:]] == [[f"S{i}", "X"] for i in range(5)]
        assert ["gone"] not in fake.calls
        started = time.perf_counter()
        await batcher.submit(["lone"], beam_size=1, nbest=1, attention=False)
        assert time.perf_counter() - started < 0.5
        await batcher.close()
        assert not batcher._thread.is_alive()
        with pytest.raises(BatcherClosed):
            await batcher.submit(["late"], beam_size=1, nbest=1, attention=False)

    asyncio.run(scenario())


def test_batcher_lives_on_when_counting_pieces_fails():
    """A tokenizer that raises while a round is collected must not kill the worker thread
    (its requests would then wait forever)."""

    class BrokenSource:
        def encode(self, sentences):
            raise RuntimeError("cannot encode")

    async def scenario():
        fake = FakeTranslator()
        fake.tokenizers = type("Tokenizers", (), {"src": BrokenSource()})()
        batcher = DynamicBatcher(fake, window_ms=1, name="fake")
        results = await asyncio.wait_for(asyncio.gather(
            *(batcher.submit([f"s{i}"], beam_size=1, nbest=1, attention=False)
              for i in range(3))), timeout=10)
        assert [r[0][0].text for r in results] == ["S0", "S1", "S2"]
        assert batcher._thread.is_alive()
        await batcher.close()

    asyncio.run(scenario())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def post(url: str, payload: dict, timeout: float = 60) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.status, json.loads(response.read())


@pytest.mark.slow
def test_sigterm_answers_the_request_in_flight_and_exits_0(trained_checkpoint, tmp_path,
                                                           run_python):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # A long collection window keeps the request in flight while SIGTERM arrives.
    process = run_python.start(
        [ROOT / "serve.py", f"checkpoint={trained_checkpoint}", f"port={port}", "device=cpu",
         "num_threads=1", "batching.window_ms=1500"], cwd=tmp_path, env=ENV,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.result().stderr
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the server did not start in 60 s"
            time.sleep(0.2)
        answer: dict = {}
        thread = threading.Thread(
            target=lambda: answer.update(result=post(f"{url}/v1/translate", {"text": ["red cat"]}))
        )
        thread.start()
        time.sleep(0.5)  # the request waits in the batcher's window
        process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with pytest.raises(OSError):  # no new connections
            post(f"{url}/v1/translate", {"text": ["moon"]}, timeout=2)
        thread.join(30)
        assert answer["result"][0] == 200
        assert answer["result"][1]["translations"][0]["text"] == "red cat"
        process.wait(timeout=30)
        ended = process.result()
        assert ended.returncode == 0, ended.stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.result()
    assert list(tmp_path.iterdir()) == []  # no outputs/ or .hydra/
