"""The translation API (seq2seq.serving): answers, errors, dynamic batching, graceful shutdown.

The API tests run the app in-process through FastAPI's test client; the shutdown test runs
``serve.py`` as a real uvicorn process on 127.0.0.1. The server's answers are compared with
the Translator's and translate.py's for the same checkpoint, never with strings a trained model
is expected to produce. No test depends on how fast a thread runs: where a test needs the
worker busy, events hold it; every wait is bounded only to fail on a hang.
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
from contextlib import closing
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi", reason="serving needs `pip install .[serve]` (FastAPI)")
pytest.importorskip("httpx", reason="FastAPI's test client needs httpx")
from fastapi.testclient import TestClient  # noqa: E402

from seq2seq.inference.decode_options import DecodeOptions  # noqa: E402
from seq2seq.inference.runtimes import load_translator  # noqa: E402
from seq2seq.inference.translator import Translator  # noqa: E402
from seq2seq.serving.app import create_app  # noqa: E402
from seq2seq.serving.batcher import BatcherClosed, DynamicBatcher  # noqa: E402
from seq2seq.serving.models import ServedModel, load_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
LINES = ["red cat", "", "one two big house", "blue bird sun", "moon", "small tree green dog"]
HANG = 30  # seconds: a bounded wait fails only when something hangs
WORDS = ["red", "blue", "green", "cat", "dog", "house", "tree", "car"]  # pieces of the copy model
BEAM3 = DecodeOptions(beam_size=3)  # the test server's defaults


@pytest.fixture(scope="module")
def translator(trained_checkpoint) -> Translator:
    return load_translator(trained_checkpoint, device="cpu")


@pytest.fixture(scope="module")
def served(trained_checkpoint) -> ServedModel:
    """The copy model as serve.py loads it, at beam 3 unless a request says otherwise."""
    return load_model(trained_checkpoint, device="cpu", options=BEAM3)


@pytest.fixture
def client(served):
    app = create_app({"copy": served}, max_lines=8, max_chars=200,
                     max_beam_size=6)
    with TestClient(app) as test_client:
        yield test_client


def translate(client, text, **options):
    return client.post("/v1/translate", json={"text": text, **options})


def best_text(translator: Translator, line: str, options: DecodeOptions | None = None) -> str:
    """What the translator itself gives for ``line`` with ``options``."""
    return translator.translate([line], options)[0][0].text


def wait_until(condition, what: str) -> None:
    """Polls ``condition`` until it holds; fails only after ``HANG`` seconds (a hang)."""
    deadline = time.monotonic() + HANG
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not after {HANG} s"
        time.sleep(0.01)


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
    # The server's defaults (beam 3, nbest 1) give translate.py's best lines.
    default = translate(client, LINES).json()
    assert default["nbest"] == 1
    assert [t["text"] for t in default["translations"]] == [e[1] for e in expected[::2]]


def test_attention_pieces_and_weights(client, translator):
    body = translate(client, ["green dog", ""], attention=True).json()
    first, empty = body["translations"]
    best = first["hypotheses"][0]
    (expected,) = translator.translate(["green dog"], BEAM3, return_attention=True)[0]
    assert first["source_pieces"] == expected.source_pieces == ["▁green", "▁dog"]
    assert best["target_pieces"] == expected.target_pieces
    assert best["text"] == expected.text
    weights = best["attention"]
    assert len(weights) == len(best["target_pieces"]) + 1
    assert all(len(row) == len(first["source_pieces"]) + 1 for row in weights)
    assert all(abs(sum(row) - 1) < 1e-2 for row in weights)
    # The Translator's weights, rounded to 4 decimals for JSON.
    torch.testing.assert_close(torch.tensor(weights), expected.attention.float(), atol=1e-4,
                               rtol=0)
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
        ({"text": ["red"], "search": "nucleus"}, 422),
        ({"text": ["red"], "search": "sample", "temperature": 0}, 422),
        ({"text": ["red"], "search": "sample", "top_p": 1.5}, 422),
        ({"text": ["red"], "search": "sample", "top_k": -1}, 422),
        ({"text": ["red"], "search": "sample", "epsilon": 1}, 422),
        ({"text": ["red"], "search": "sample", "seed": -1}, 422),
        ({"text": ["red"], "search": "sample", "nbest": 7}, 422),  # max_beam_size 6
        ({"text": ["red", "cat"], "prefix": ["red"]}, 422),  # one per text
        ({"text": ["red"], "constraints": [["cat"], []]}, 422),
        ({"text": ["red"], "constraints": ["cat"]}, 422),  # a list of lists
        ({"text": ["red"], "constraints": [["Ž"]]}, 422),  # a piece the model lacks
        ({"text": ["red"], "constraints": [[""]]}, 422),
        ({"text": ["red"], "prefix": ["Ž"]}, 422),
        ({"text": ["red"], "search": "sample", "constraints": [["cat"]]}, 422),
    ],
)
def test_errors_are_json_and_harmless(client, translator, payload, status):
    response = client.post("/v1/translate", json=payload)
    assert response.status_code == status, response.text
    assert isinstance(response.json()["error"], str) and response.json()["error"]
    after = translate(client, ["red cat"]).json()["translations"][0]["text"]
    assert after == best_text(translator, "red cat")  # the server still answers as before


@pytest.mark.parametrize(("payload", "message"), [
    ({"text": ["red", "cat"], "prefix": ["red"]},
     "prefix: 1 entries for 2 texts: give one per text"),
    ({"text": ["red"], "constraints": [["Ž"]]},
     "constraints.0: constraint 'Ž' has a piece the model's target vocabulary lacks: it cannot "
     "be produced"),
    ({"text": ["red", "cat"], "prefix": ["", "Ž"]},
     "prefix.1: prefix 'Ž' has a piece the model's target vocabulary lacks: it cannot be produced"),
    ({"text": ["red"], "search": "sample", "constraints": [["cat"]]},
     "constraints: constraints and terms need search=beam (sampling cannot promise a phrase)"),
    ({"text": ["red"], "beam_size": 2, "nbest": 3},
     "nbest must be between 1 and beam_size (2), got 3"),
    ({"text": ["red"], "search": "sample", "top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
    ({"text": ["red"], "beam_size": 0}, "beam_size must be at least 1, got 0"),
    ({"text": ["red"], "nbest": 0}, "nbest must be between 1 and beam_size (3), got 0"),
    ({"text": ["red"], "length_penalty": -0.5}, "length_penalty must be a number >= 0, got -0.5"),
    ({"text": ["red"], "max_len_b": 1000}, "max_len_b: Extra inputs are not permitted"),
    ({"text": ["red"], "constraints": [[f"{a} {b}" for a in WORDS for b in WORDS]]},
     "constraints.0: 64 phrases; at most 62 per sentence"),
])
def test_steering_errors_say_what_is_wrong_in_one_line(client, payload, message):
    response = client.post("/v1/translate", json=payload)
    assert response.status_code == 422
    assert response.json()["error"] == message


def test_constraints_prefixes_and_sampling(client, translator):
    texts = ["red cat big house", "blue bird", "one two", ""]
    prefixes, constraints = ["green", "", "sun moon", "moon"], [["moon"], [], ["fish"], ["cat"]]
    body = translate(client, texts, prefix=prefixes, constraints=constraints).json()
    expected = translator.translate(texts, BEAM3, prefixes=prefixes, constraints=constraints)
    assert body["search"] == "beam"
    assert [t["text"] for t in body["translations"]] == [n[0].text for n in expected]
    for entry, prefix, phrases, text in zip(body["translations"], prefixes, constraints, texts,
                                            strict=True):
        assert text == "" or entry["text"].startswith(prefix) and all(
            phrase in entry["text"] for phrase in phrases)
    # Plain requests are not changed by steered ones decoded beside them.
    assert [t["text"] for t in translate(client, texts).json()["translations"]] == [
        n[0].text for n in translator.translate(texts, BEAM3)]

    options = {"temperature": 2.0, "top_k": 5, "seed": 11}
    sampled = translate(client, texts[:3], search="sample", nbest=3, prefix=prefixes[:3],
                        **options).json()
    sample = DecodeOptions(search="sample", nbest=3, beam_size=3, **options)
    want = translator.translate(texts[:3], sample, prefixes=prefixes[:3])
    assert (sampled["search"], sampled["nbest"]) == ("sample", 3)
    assert [[h["text"] for h in t["hypotheses"]] for t in sampled["translations"]] == [
        [h.text for h in n] for n in want]
    again = translate(client, texts[:3], search="sample", nbest=3, prefix=prefixes[:3],
                      **options).json()
    assert again["translations"] == sampled["translations"]  # a seed: the same answer


def test_seeded_jobs_are_decoded_alone_and_steering_travels_with_its_sentences():
    """In one round: two seeded jobs get a call each, the plain jobs share one, and a group
    whose jobs mix prefixes and none gets an empty prefix for the latter's sentences."""

    class Recorder(FakeTranslator):
        def translate(self, sentences, options, *, return_attention=False,
                      attention_heads=False, **steering):
            self.calls.append((options.search, options.seed, list(sentences), steering))
            return [[type("T", (), {"text": s})()] for s in sentences]

    seeded = DecodeOptions(search="sample", beam_size=2, seed=1)
    beam = DecodeOptions(beam_size=2)

    async def scenario():
        recorder = Recorder()
        batcher = DynamicBatcher(recorder, window_ms=200, name="recorder")
        jobs = [
            batcher.submit(["a"], seeded),
            batcher.submit(["b"], seeded),
            batcher.submit(["c", "d"], beam, prefixes=["x", ""]),
            batcher.submit(["e"], beam),
        ]
        results = await asyncio.wait_for(asyncio.gather(*jobs), HANG)
        await batcher.close()
        return recorder.calls, results

    calls, results = asyncio.run(scenario())
    assert [[n[0].text for n in r] for r in results] == [["a"], ["b"], ["c", "d"], ["e"]]
    assert sorted(calls, key=lambda call: call[2]) == [
        ("sample", 1, ["a"], {}), ("sample", 1, ["b"], {}),
        ("beam", None, ["c", "d", "e"], {"prefixes": ["x", "", ""]})]


def test_a_server_with_terms_applies_them_to_every_request(translator):
    from seq2seq.inference.glossary import Glossary

    glossary = Glossary.parse(["cat\tmoon", "blue bird\tfish"])
    app = create_app({"copy": ServedModel(translator)}, terms=glossary)
    texts = ["red cat", "blue bird", "one two"]
    with TestClient(app) as client:
        assert client.get("/v1/models").json()["terms"] == 2
        body = translate(client, texts, constraints=[["tree"], [], []]).json()
        phrases = [["tree", "moon"], ["fish"], []]
        assert [t["text"] for t in body["translations"]] == [
            n[0].text for n in translator.translate(texts, constraints=phrases)]  # default beam 5
        assert all(p in t["text"] for t, ps in zip(body["translations"], phrases, strict=True)
                   for p in ps)
        refused = translate(client, texts, search="sample")
        assert refused.status_code == 422
        assert refused.json()["error"] == ("terms: constraints and terms need search=beam "
                                           "(sampling cannot promise a phrase)")
        assert translate(client, ["one two"], search="sample").status_code == 200


def test_serve_py_reads_terms_and_refuses_one_a_model_cannot_write(trained_checkpoint, tmp_path,
                                                                   capsys):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from seq2seq import CONFIG_DIR
    from seq2seq.cli.serve import build_app

    def config(terms: Path):
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
                return compose(config_name="serve", overrides=[
                    f"checkpoint={trained_checkpoint}", "name=copy", "device=cpu",
                    f"terms={terms}", "terms_ignore_case=true"])
        finally:
            GlobalHydra.instance().clear()

    terms = tmp_path / "terms.tsv"
    terms.write_text("CAT\tmoon\n", encoding="utf-8")
    with TestClient(build_app(config(terms))) as client:
        assert client.get("/v1/models").json()["terms"] == 1
        assert "moon" in translate(client, ["red cat"]).json()["translations"][0]["text"]
    terms.write_text("cat\tmoon\n\ndog\tŽ\n", encoding="utf-8")
    with pytest.raises(SystemExit):
        build_app(config(terms))
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: model copy: {terms}: line 3: target term 'Ž' has a piece the model's target "
        "vocabulary lacks: it cannot be produced")


def test_serve_yaml_sets_the_servers_default_search(trained_checkpoint, translator):
    """serve.yaml takes every decoding option (the decoding group's): sampling can be the
    default of every request, which still may ask for beam search."""
    from seq2seq.cli.common import compose
    from seq2seq.cli.serve import build_app

    cfg = compose("serve", [f"checkpoint={trained_checkpoint}", "name=copy", "device=cpu",
                            "search=sample", "seed=3", "nbest=2", "top_k=2"])
    sampled = DecodeOptions(search="sample", seed=3, nbest=2, top_k=2)
    with TestClient(build_app(cfg)) as client:
        defaults = client.get("/v1/models").json()["models"][0]["defaults"]
        assert (defaults["search"], defaults["nbest"], defaults["top_k"]) == ("sample", 2, 2)
        body = translate(client, ["red cat"]).json()["translations"][0]
        assert [h["text"] for h in body["hypotheses"]] == [
            t.text for t in translator.translate(["red cat"], sampled)[0]]
        beam = translate(client, ["red cat"], search="beam", nbest=1).json()
        assert beam["translations"][0]["text"] == best_text(translator, "red cat")


def test_malformed_json_and_oversized_body(client):
    response = client.post("/v1/translate", content=b'{"text": ["red"',
                           headers={"content-type": "application/json"})
    assert response.status_code == 422 and "error" in response.json()
    huge = json.dumps({"text": ["x" * 10_000]})
    assert client.post("/v1/translate", content=huge,
                       headers={"content-type": "application/json"}).status_code == 413
    assert translate(client, ["moon"]).status_code == 200


def test_a_request_sets_any_decoding_option_but_the_length_limit(client, translator):
    """The request's decoding fields are DecodeOptions' (declared there once, described with
    its words), less the output length limit, which stays the server's."""
    from dataclasses import fields

    from seq2seq.inference.decode_options import described_options
    from seq2seq.serving.schemas import TranslateRequest

    declared = {option.name for option in fields(DecodeOptions)}
    requested = declared & set(TranslateRequest.model_fields)
    assert requested == declared - {"max_len_a", "max_len_b"}
    properties = client.get("/openapi.json").json()["components"]["schemas"][
        "TranslateRequest"]["properties"]
    for name in requested:
        assert properties[name]["description"].startswith(described_options()[name][2])
    ranked = DecodeOptions(beam_size=3, nbest=3, length_penalty=0.0)
    body = translate(client, LINES, nbest=3, length_penalty=0.0).json()
    want = translator.translate(LINES, ranked)
    assert [[h["score"] for h in entry["hypotheses"]] for entry in body["translations"]] == [
        pytest.approx([h.score for h in hypotheses], abs=1e-5) for hypotheses in want]


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
    served = load_model(trained_checkpoint, device="cpu", options=DecodeOptions(beam_size=2))
    assert served.scorer == "AdditiveScorer" and served.parameters > 1000
    assert served.options.beam_size == served.defaults()["beam_size"] == 2


class GatedTranslator(Translator):
    """A Translator whose decodes wait until the test opens ``gate``; ``decoding`` tells the
    test that the batcher's worker has entered one."""

    def __init__(self, *args, **options) -> None:
        super().__init__(*args, **options)
        self.decoding = threading.Event()
        self.gate = threading.Event()

    def translate(self, sentences, *args, **options):
        self.decoding.set()
        assert self.gate.wait(HANG), "the test never opened the gate"
        return super().translate(sentences, *args, **options)


def test_concurrent_requests_share_batches_and_get_their_own_answers(translator, copy_sentences):
    inputs = [[s] for s in copy_sentences(40, seed=7)] + [copy_sentences(3, seed=8)]
    options = [{"beam_size": 1 + i % 3, "attention": i % 2 == 0} for i in range(len(inputs))]
    expected = [
        [n[0].text for n in translator.translate(
            text, DecodeOptions(beam_size=option["beam_size"]), return_attention=False)]
        for text, option in zip(inputs, options, strict=True)
    ]  # the same as each request alone: a translation does not depend on its batch
    gated = GatedTranslator(translator.model, translator.tokenizers, device="cpu")
    app = create_app({"copy": ServedModel(gated)})
    # One client thread per request: every request is waiting in the batcher at once.
    with TestClient(app) as client, ThreadPoolExecutor(len(inputs)) as pool:
        batcher = app.state.batchers["copy"]
        first = pool.submit(translate, client, inputs[0], **options[0])
        assert gated.decoding.wait(HANG)  # the worker holds the first request's round...
        rest = [pool.submit(translate, client, text, **option)
                for text, option in zip(inputs[1:], options[1:], strict=True)]
        wait_until(lambda: batcher._queue.qsize() == len(rest), "requests queued")
        gated.gate.set()  # ...and the next round takes every request queued meanwhile
        responses = [first.result(HANG), *(future.result(HANG) for future in rest)]
    assert (batcher.rounds, batcher.largest_round) == (2, len(rest))
    for response, want in zip(responses, expected, strict=True):
        assert response.status_code == 200
        assert [t["text"] for t in response.json()["translations"]] == want


GREEDY = DecodeOptions(beam_size=1)


class FakeTranslator:
    """Upper-cases; fails on "boom"; on "slow", tells the test through ``decoding_slow`` and
    waits until it sets ``release``."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.decoding_slow = threading.Event()
        self.release = threading.Event()

    def translate(self, sentences, options, *, return_attention=False, attention_heads=False):
        self.calls.append(list(sentences))
        if "boom" in sentences:
            raise RuntimeError("boom")
        if "slow" in sentences:
            self.decoding_slow.set()
            assert self.release.wait(HANG), "the test never released the slow decode"
        return [[type("T", (), {"text": s.upper()})()] for s in sentences]


def test_batcher_survives_failures_and_cancelled_requests():
    def submit(batcher, sentences):
        return batcher.submit(sentences, GREEDY)

    async def scenario():
        fake = FakeTranslator()
        batcher = DynamicBatcher(fake, window_ms=1, name="fake")
        slow = asyncio.ensure_future(submit(batcher, ["slow"]))
        assert await asyncio.to_thread(fake.decoding_slow.wait, HANG)  # the worker is busy
        gone = asyncio.ensure_future(submit(batcher, ["gone"]))
        boom = asyncio.ensure_future(submit(batcher, ["boom"]))
        await asyncio.sleep(0)  # both tasks run up to their wait: their jobs are queued
        assert not gone.done() and not boom.done()
        gone.cancel()  # a client that disconnected while its job waited
        fake.release.set()
        with pytest.raises(RuntimeError, match="boom"):
            await asyncio.wait_for(boom, HANG)
        results = await asyncio.wait_for(asyncio.gather(
            slow, *(submit(batcher, [f"s{i}", "x"]) for i in range(5))), HANG)
        assert [r[0].text for r in results[0]] == ["SLOW"]
        assert [[n[0].text for n in r] for r in results[1:]] == [[f"S{i}", "X"] for i in range(5)]
        assert gone.cancelled() and ["gone"] not in fake.calls
        # The worker lives on: a lone request is answered (the bound only catches a hang).
        lone = await asyncio.wait_for(submit(batcher, ["lone"]), HANG)
        assert [n[0].text for n in lone] == ["LONE"]
        await batcher.close()
        assert not batcher._thread.is_alive()
        with pytest.raises(BatcherClosed):
            await batcher.submit(["late"], GREEDY)

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
            *(batcher.submit([f"s{i}"], GREEDY)
              for i in range(3))), timeout=HANG)
        assert [r[0][0].text for r in results] == ["S0", "S1", "S2"]
        assert batcher._thread.is_alive()
        await batcher.close()

    asyncio.run(scenario())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class HeldRequest:
    """A POST whose body is held back: the server has started it (and is waiting for the body)
    once it answers ``100 Continue``, so it is in flight for as long as the test likes."""

    def __init__(self, port: int, path: str, payload: dict) -> None:
        self.body = json.dumps(payload).encode()
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=HANG)
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(self.body)}\r\n"
                "Expect: 100-continue\r\n\r\n")
        self.sock.sendall(head.encode())
        interim = self._read_until(b"\r\n\r\n")
        assert interim.startswith(b"HTTP/1.1 100 "), interim

    def _read_until(self, end: bytes) -> bytes:
        data = b""
        while end not in data:
            chunk = self.sock.recv(4096)
            assert chunk, f"the server closed the connection after {data!r}"
            data += chunk
        return data

    def finish(self) -> tuple[int, dict]:
        """Sends the body; returns the response's status and JSON (the server then closes)."""
        with closing(self.sock):
            self.sock.sendall(self.body)
            response = b""
            while chunk := self.sock.recv(65536):
                response += chunk
        head, _, body = response.partition(b"\r\n\r\n")
        return int(head.split()[1]), json.loads(body)


def refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=HANG).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.mark.slow
def test_sigterm_answers_the_request_in_flight_and_exits_0(trained_checkpoint, tmp_path,
                                                           run_python):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = run_python.start(
        [ROOT / "serve.py", f"checkpoint={trained_checkpoint}", f"port={port}", "device=cpu",
         "num_threads=1"], cwd=tmp_path, env=ENV,
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
        in_flight = HeldRequest(port, "/v1/translate", {"text": ["red cat"]})
        process.send_signal(signal.SIGTERM)
        wait_until(lambda: refuses_connections(port), "new connections refused after SIGTERM")
        assert process.poll() is None  # still running: it waits for the request in flight
        status, body = in_flight.finish()
        assert status == 200, body
        expected = load_translator(trained_checkpoint)
        assert body["translations"][0]["text"] == best_text(expected, "red cat")  # beam 5
        process.wait(timeout=HANG)
        ended = process.result()
        assert ended.returncode == 0, ended.stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.result()
    assert list(tmp_path.iterdir()) == []  # no outputs/ or .hydra/


def test_a_transformer_answers_with_every_layer_and_head(translator, tmp_path):
    """attention_heads: the Transformer's [layer][head] matrices (their mean is its attention);
    a model without heads (the RNN) answers without them; the models list names the
    Transformer's attention."""
    from conftest import transformer_checkpoint

    served = load_model(transformer_checkpoint(tmp_path), device="cpu",
                        options=DecodeOptions(beam_size=3))
    assert served.scorer == "TransformerDecoder"
    app = create_app({"transformer": served, "copy": ServedModel(translator)})
    with TestClient(app) as client:
        for model in ("transformer", "copy"):
            response = translate(client, ["red cat big house", ""], model=model, attention=True,
                                 attention_heads=True)
            assert response.status_code == 200, response.text
            full, blank = response.json()["translations"]
            best, empty = full["hypotheses"][0], blank["hypotheses"][0]
            assert "attention_heads" not in empty
            assert all("attention_heads" not in h for h in full["hypotheses"][1:])
            if model == "copy":
                assert "attention_heads" not in best
                continue
            heads = torch.tensor(best["attention_heads"])  # (L, H, T + 1, S + 1)
            assert heads.shape[:2] == (2, 2)
            assert heads.shape[2:] == (len(best["target_pieces"]) + 1, 5)
            torch.testing.assert_close(heads.mean(dim=(0, 1)), torch.tensor(best["attention"]),
                                       atol=2e-4, rtol=0)
        # Without attention, no heads either.
        plain = translate(client, ["red cat"], model="transformer", attention_heads=True)
        assert "attention" not in plain.json()["translations"][0]["hypotheses"][0]
