"""Load-test the translation server on the loopback interface: throughput and latency.

Starts ``serve.py`` on 127.0.0.1 and a free port (or uses ``--url`` of one already running on
this machine), sends single-sentence requests at each concurrency level (default 1, 8, 32),
each level bounded by ``--requests`` and ``--max-seconds``, and prints requests/s and p50/p95
latency per level, the errors, the answers that differ from the sentence's reference (its
translation requested alone, before the load), and the ratio of throughput at the highest
concurrency to throughput at 1. Exit status 1 if any request failed or answered wrongly.

    python -m benchmarks.load_test --checkpoint runs/x/checkpoints/best.pt
    python -m benchmarks.load_test --checkpoint best.pt --beam-size 5 --requests 400 \\
        -- num_threads=2
    python -m benchmarks.load_test --url http://127.0.0.1:8000

Arguments after ``--`` are passed to ``serve.py`` as Hydra overrides. Needs httpx.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
# Mixed lengths; for a copy-task test model any words do, the check is against the reference.
SENTENCES = [
    "Ein Hund läuft über die Wiese.", "Zwei Männer spielen Fußball im Park.",
    "Eine Frau liest ein Buch.", "Kinder spielen am Strand.", "Ein Mann fährt Fahrrad.",
    "Ein kleines Mädchen in einem rosa Kleid klettert eine Treppe hinauf.",
    "Drei Personen sitzen auf einer Bank und unterhalten sich.", "Ein Hund.",
    "Eine Gruppe von Menschen steht vor einem großen Gebäude und wartet auf den Bus.",
    "red cat", "one two big house", "blue bird sun moon", "small tree green dog fish",
    "big car red house two cats", "sun", "green fish blue bird small tree one dog",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(checkpoint: str, overrides: list[str], timeout: float = 120):
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "serve.py"), f"checkpoint={checkpoint}", "host=127.0.0.1",
         f"port={port}", *overrides],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            sys.exit(f"error: the server exited: {process.communicate()[1].strip()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1):
                return process, url
        except OSError:
            if time.monotonic() > deadline:
                process.kill()
                sys.exit(f"error: the server did not start within {timeout:.0f} s")
            time.sleep(0.2)


async def one_request(client: httpx.AsyncClient, sentence: str, options: dict):
    started = time.perf_counter()
    response = await client.post("/v1/translate", json={"text": [sentence], **options})
    elapsed = time.perf_counter() - started
    if response.status_code != 200:
        return elapsed, None
    return elapsed, response.json()["translations"][0]["text"]


async def level(url: str, concurrency: int, *, requests: int, max_seconds: float,
                options: dict, reference: dict[str, str]) -> dict:
    latencies: list[float] = []
    errors = wrong = 0
    next_index = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
        started = time.perf_counter()
        deadline = started + max_seconds

        async def worker() -> None:
            nonlocal next_index, errors, wrong
            while next_index < requests and time.perf_counter() < deadline:
                sentence = SENTENCES[next_index % len(SENTENCES)]
                next_index += 1
                try:
                    elapsed, text = await one_request(client, sentence, options)
                except httpx.HTTPError:
                    errors += 1
                    continue
                if text is None:
                    errors += 1
                    continue
                latencies.append(elapsed)
                wrong += text != reference[sentence]

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    done = len(latencies)
    cuts = statistics.quantiles(latencies, n=20) if done >= 2 else latencies * 19 or [0.0] * 19
    return {
        "concurrency": concurrency, "requests": done + errors, "errors": errors, "wrong": wrong,
        "rps": done / seconds if seconds else 0.0, "p50": statistics.median(latencies or [0.0]),
        "p95": cuts[18], "seconds": seconds,
    }


async def run(url: str, args) -> list[dict]:
    options = {"beam_size": args.beam_size} if args.beam_size else {}
    reference = {}
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        for sentence in SENTENCES:  # each alone: the answers under load must equal these
            _, text = await one_request(client, sentence, options)
            if text is None:
                sys.exit(f"error: the reference request for {sentence!r} failed")
            reference[sentence] = text
    results = []
    for concurrency in args.concurrency:
        results.append(await level(url, concurrency, requests=args.requests,
                                   max_seconds=args.max_seconds, options=options,
                                   reference=reference))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="start serve.py with this checkpoint")
    source.add_argument("--url", help="a running server on this machine (loopback only)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=300, help="requests per level, at most")
    parser.add_argument("--max-seconds", type=float, default=30.0, help="per level, at most")
    parser.add_argument("--beam-size", type=int, default=None, help="default: the server's")
    parser.add_argument("overrides", nargs="*", help="serve.py overrides (after --)")
    args = parser.parse_args()
    if args.requests < 1 or args.max_seconds <= 0 or min(args.concurrency) < 1:
        parser.error("--requests, --max-seconds and --concurrency must be positive")

    process = None
    if args.url:
        url = args.url.rstrip("/")
        if urllib.parse.urlsplit(url).hostname not in LOOPBACK:
            parser.error("--url must be a loopback address (127.0.0.1, localhost, ::1)")
    else:
        process, url = start_server(args.checkpoint, args.overrides)
    try:
        results = asyncio.run(run(url, args))
    finally:
        if process is not None:
            process.terminate()
            process.communicate(timeout=60)

    print(f"{'concurrency':>11} {'requests':>8} {'errors':>6} {'wrong':>5} {'req/s':>8} "
          f"{'p50 ms':>8} {'p95 ms':>8}")
    for r in results:
        print(f"{r['concurrency']:>11} {r['requests']:>8} {r['errors']:>6} {r['wrong']:>5} "
              f"{r['rps']:>8.1f} {r['p50'] * 1000:>8.1f} {r['p95'] * 1000:>8.1f}")
    first, last = results[0], results[-1]
    if first["rps"] > 0 and len(results) > 1:
        print(f"throughput at {last['concurrency']} / at {first['concurrency']}: "
              f"{last['rps'] / first['rps']:.1f}x")
    failed = sum(r["errors"] + r["wrong"] for r in results)
    print("all answers correct" if not failed else f"{failed} failed or wrong answers")
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
