"""Dynamic batching: the sentences of requests that arrive together are decoded together.

What a round takes and groups, and why the answers do not depend on it: docs/serving.md,
"Batching and shutdown". One :class:`DynamicBatcher` per model owns one worker thread, the only
thread that ever runs that model. Requests (``submit``, a coroutine) go into a thread-safe queue
and wait on an asyncio future. A round takes everything queued and collects until ``window_ms``
after its first job arrived, so a lone request waits at most that before its decode starts;
under load the queue fills while the model is busy and the next round takes all of it. Each
group of jobs is one ``translate`` call (the translator sorts and cuts the sentences into length
batches itself), its results sliced back to each job in order; a job's prefixes and constraints
travel with its sentences. ``close`` stops taking jobs, lets the worker finish every queued job,
and joins it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from seq2seq.inference.decode_options import DecodeOptions

logger = logging.getLogger(__name__)

_STOP = object()


class BatcherClosed(RuntimeError):
    """The batcher is shutting down and takes no new jobs."""


class _Key(NamedTuple):
    """What a job's sentences are decoded with; jobs with equal keys share a ``translate`` call.
    ``constrained``: the job has constraints (decoded apart from plain jobs, which beam search
    keeps)."""

    options: DecodeOptions
    attention: bool
    attention_heads: bool
    constrained: bool


@dataclass
class _Job:
    sentences: list[str]
    key: _Key
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    prefixes: list[str] | None = None  # one per sentence, or None
    constraints: list[list[str]] | None = None  # one list per sentence, or None
    tokens: int = 0
    arrived: float = field(default_factory=time.perf_counter)


def _settle(future: asyncio.Future, result=None, error: BaseException | None = None) -> None:
    """Resolve a future in its loop's thread, unless its request was cancelled meanwhile."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class DynamicBatcher:
    """Collects concurrent requests for one model into shared decoding rounds: a round keeps
    collecting ``window_ms`` after its first job arrived, or until its jobs hold ``max_tokens``
    source pieces. ``translator``: a :class:`~seq2seq.inference.translator.BaseTranslator` (or
    anything with its ``translate`` and ``tokenizers``); ``name`` names the worker thread and
    the logs."""

    def __init__(
        self, translator, *, window_ms: float = 5.0, max_tokens: int = 8000, name: str = "model"
    ) -> None:
        if window_ms < 0:
            raise ValueError(f"window_ms must be >= 0, got {window_ms}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        self.translator = translator
        self.window = window_ms / 1000.0
        self.max_tokens = max_tokens
        self.name = name
        self._queue: queue.Queue = queue.Queue()
        self._closed = False
        self._lock = threading.Lock()  # orders submit's check against close's sentinel
        self.rounds = 0  # decoding rounds run (for tests and logs)
        self.largest_round = 0  # most jobs decoded in one round
        self._thread = threading.Thread(target=self._run, name=f"batcher-{name}", daemon=True)
        self._thread.start()

    # -- event loop side -------------------------------------------------------------------
    async def submit(
        self, sentences: Sequence[str], options: DecodeOptions, *, attention: bool = False,
        attention_heads: bool = False, prefixes: Sequence[str] | None = None,
        constraints: Sequence[Sequence[str]] | None = None,
    ) -> list:
        """Translate ``sentences`` with ``options`` (checked against the translator by the
        caller); returns ``translate``'s result for them, in order. ``attention_heads``: every
        layer's and head's weights too, where the model has them. ``prefixes`` and
        ``constraints`` are ``translate``'s, one entry per sentence, checked by the caller (a bad
        one would fail the whole round's group).

        Raises:
            BatcherClosed: after ``close``.
            Exception: whatever the decode raised.
        """
        loop = asyncio.get_running_loop()
        key = _Key(options, attention, attention_heads,
                   constrained=bool(constraints) and any(constraints))
        job = _Job(list(sentences), key, loop.create_future(), loop,
                   prefixes=None if prefixes is None else list(prefixes),
                   constraints=None if constraints is None else [list(c) for c in constraints])
        with self._lock:
            if self._closed:
                raise BatcherClosed(f"model {self.name} is shutting down")
            self._queue.put(job)
        return await job.future

    async def close(self) -> None:
        """Take no new jobs, finish the queued ones, stop the worker."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(_STOP)
        await asyncio.to_thread(self._thread.join)

    # -- worker thread ---------------------------------------------------------------------
    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is _STOP:
                break
            jobs, stopping = self._collect(first)
            self._decode(jobs)
        logger.debug("batcher %s stopped after %d rounds", self.name, self.rounds)

    def _tokens(self, job: _Job) -> int:
        """The job's source pieces, for the round's budget (an estimate is enough)."""
        try:
            return sum(len(ids) + 1 for ids in self.translator.tokenizers.src.encode(job.sentences))
        except Exception:  # noqa: BLE001 - the decode reports it; the worker must live on
            logger.debug("could not count the pieces of a job", exc_info=True)
        return sum(len(s.split()) + 1 for s in job.sentences)

    def _collect(self, first: _Job) -> tuple[list[_Job], bool]:
        """The jobs of one round; the flag says a stop was seen (the round still runs)."""
        jobs = [first]
        first.tokens = self._tokens(first)
        tokens = first.tokens
        deadline = first.arrived + self.window
        while tokens < self.max_tokens:
            try:
                timeout = deadline - time.perf_counter()
                job = self._queue.get_nowait() if timeout <= 0 else self._queue.get(timeout=timeout)
            except queue.Empty:
                break
            if job is _STOP:
                return jobs, True
            job.tokens = self._tokens(job)
            jobs.append(job)
            tokens += job.tokens
        return jobs, False

    @staticmethod
    def _reply(job: _Job, result, error: BaseException | None = None) -> None:
        # A closed loop (RuntimeError) means nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            job.loop.call_soon_threadsafe(_settle, job.future, result, error)

    @staticmethod
    def _groups(jobs: list[_Job]) -> list[list[_Job]]:
        """The jobs that share a ``translate`` call: equal options, a seeded job alone."""
        groups: dict[object, list[_Job]] = {}
        for job in jobs:
            alone = job.key.options.seeded
            groups.setdefault(id(job) if alone else job.key, []).append(job)
        return list(groups.values())

    @staticmethod
    def _steering(group: list[_Job]) -> dict[str, list]:
        """``translate``'s prefixes and constraints for a group's sentences, where a job has
        them (the others' sentences get none)."""
        options: dict[str, list] = {}
        if any(job.prefixes is not None for job in group):
            options["prefixes"] = [p for job in group
                                   for p in (job.prefixes or [""] * len(job.sentences))]
        if any(job.constraints is not None for job in group):
            options["constraints"] = [c for job in group
                                      for c in (job.constraints or [[]] * len(job.sentences))]
        return options

    def _decode(self, jobs: list[_Job]) -> None:
        live = [job for job in jobs if not job.future.cancelled()]
        for group in self._groups(live):
            key = group[0].key
            sentences = [s for job in group for s in job.sentences]
            try:
                results = self.translator.translate(
                    sentences, key.options, return_attention=key.attention,
                    attention_heads=key.attention_heads, **self._steering(group))
            except Exception as error:  # one bad round must not stop the worker
                logger.exception("decoding failed on model %s", self.name)
                for job in group:
                    self._reply(job, None, error)
                continue
            start = 0
            for job in group:
                part = results[start : start + len(job.sentences)]
                start += len(job.sentences)
                self._reply(job, part)
        self.rounds += 1
        self.largest_round = max(self.largest_round, len(live))
