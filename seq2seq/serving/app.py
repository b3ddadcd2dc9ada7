"""The translation API and its web page: ``create_app(models)`` builds the ASGI app.

The endpoints, their fields and their errors: docs/serving.md, "The API" and "LibreTranslate
API" (:mod:`seq2seq.serving.libretranslate`, over the same handler). Beyond those: ``GET /health``
answers 503 once shutting down, as ``/v1/translate`` does; a body too large to be a request
within the limits gets 413 unread (:class:`BodyLimit`); a decode that fails is a 500, and the
server and the other requests carry on.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from seq2seq.data.text_files import one_line
from seq2seq.inference.decode_options import DecodeOptions, check_phrase_count
from seq2seq.serving.batcher import BatcherClosed, DynamicBatcher
from seq2seq.serving.errors import ApiError
from seq2seq.serving.libretranslate import add_libretranslate_routes
from seq2seq.serving.models import ServedModel
from seq2seq.serving.schemas import (
    REQUEST_OPTIONS,
    ErrorResponse,
    ModelInfo,
    ModelsResponse,
    TranslateRequest,
    TranslateResponse,
)

logger = logging.getLogger(__name__)
STATIC_DIR = Path(__file__).resolve().parent / "static"
ERRORS = {
    404: {"model": ErrorResponse, "description": "Unknown model"},
    413: {"model": ErrorResponse, "description": "Too many sentences or characters"},
    422: {"model": ErrorResponse, "description": "Malformed JSON, wrong types, invalid options"},
    503: {"model": ErrorResponse, "description": "Shutting down"},
}


class BodyLimit:
    """Pure ASGI middleware: a declared body larger than ``max_bytes`` gets 413 unread."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            for name, value in scope.get("headers", []):
                if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                    response = JSONResponse(
                        {"error": f"request body over {self.max_bytes} bytes"}, status_code=413
                    )
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def _rounded(weights) -> list:
    """Attention weights as nested lists, to 4 decimals: enough to draw, and a smaller reply."""
    return weights.float().cpu().numpy().round(4).tolist()


def _hypothesis(translation, attention: bool) -> dict:
    item = {"text": translation.text, "score": float(translation.score)}
    if attention:
        item["target_pieces"] = list(translation.target_pieces)
        weights, heads = translation.attention, translation.attention_heads
        item["attention"] = None if weights is None else _rounded(weights)
        if heads is not None:
            item["attention_heads"] = _rounded(heads)
    return item


def _sentence(n_best, attention: bool) -> dict:
    best = n_best[0]
    entry = {"text": best.text, "score": float(best.score),
             "hypotheses": [_hypothesis(t, attention) for t in n_best]}
    if attention:
        entry["source_pieces"] = list(best.source_pieces)
    return entry


def options_of(request: TranslateRequest, model: ServedModel, max_beam_size: int) -> DecodeOptions:
    """The options the request gives over the model's defaults, checked where they are made
    (:class:`DecodeOptions`) and against its translator: a one-line ApiError(422) else."""
    given = {name: getattr(request, name) for name in REQUEST_OPTIONS
             if getattr(request, name) is not None}
    defaults = model.options
    beam_size = given.get("beam_size", defaults.beam_size)
    given.setdefault("nbest", min(defaults.nbest, beam_size))  # a smaller beam: its n best
    try:
        options = replace(defaults, **given)
        model.translator.check(options)
    except ValueError as error:
        raise ApiError(422, str(error)) from None
    rows = options.search_method.rows(options)  # beams, or samples, which cost as much
    if rows > max_beam_size:
        raise ApiError(422, f"search={options.search} keeps {rows} hypotheses a sentence with "
                            f"these options; at most {max_beam_size}")
    return options


def steering_of(request: TranslateRequest, translator, options: DecodeOptions,
                sentences: list[str], terms) -> tuple[list[str] | None, list[list[str]] | None]:
    """The request's prefixes and constraints (the glossary's terms added), checked: one per
    text, writable by the model, phrases only where the search and the runtime can force them,
    at most as many as a sentence may ask; a one-line ApiError(422) else."""
    for name in ("prefix", "constraints"):
        given = getattr(request, name)
        if given is not None and len(given) != len(sentences):
            raise ApiError(422, f"{name}: {len(given)} entries for {len(sentences)} texts: "
                                "give one per text")
    prefixes = None if request.prefix is None else [one_line(p) for p in request.prefix]
    constraints = None if request.constraints is None else [  # each phrase once
        list(dict.fromkeys(one_line(phrase) for phrase in phrases))
        for phrases in request.constraints]
    found = terms.constraints_for(sentences) if terms is not None else []
    asking = [name for name, phrases in (("constraints", constraints or []), ("terms", found))
              if any(phrases)]
    try:  # phrases with sampling, or a runtime that cannot force them (a CTranslate2 folder)
        if asking:
            translator.check(options, phrases=True)
    except ValueError as error:
        raise ApiError(422, f"{asking[0]}: {error}") from None
    try:
        for index, prefix in enumerate(prefixes or []):
            if prefix:
                translator.target_ids([prefix], f"prefix.{index}: prefix")
        for index, phrases in enumerate(constraints or []):
            translator.target_ids(phrases, f"constraints.{index}: constraint")
        if any(found):
            constraints = [list(dict.fromkeys(own + extra)) for own, extra in
                           zip(constraints or [[] for _ in sentences], found, strict=True)]
        for index, phrases in enumerate(constraints or []):  # the server's terms included
            check_phrase_count(phrases, f"constraints.{index}")
    except ValueError as error:
        raise ApiError(422, str(error)) from None
    return prefixes, constraints


def create_app(
    models: Mapping[str, ServedModel],
    *,
    max_lines: int = 64,
    max_chars: int = 20000,
    max_beam_size: int = 16,
    window_ms: float = 5.0,
    batch_tokens: int = 8000,
    terms=None,
    languages: Mapping[str, tuple[str, str]] | None = None,
) -> FastAPI:
    """The ASGI app serving ``models`` (name -> :class:`ServedModel`, which
    :func:`~seq2seq.serving.models.load_model` reads; the first is the default).

    ``max_lines``, ``max_chars`` (all sentences together, both 413 when over) and
    ``max_beam_size`` (422) bound a request; ``window_ms`` and ``batch_tokens`` are the batcher's
    collection window and budget of source pieces per round. ``terms``: a
    :class:`~seq2seq.inference.glossary.Glossary` whose target terms are constraints of every
    text holding its source terms (every model must be able to write them; serve.py checks
    that). ``languages``: model name -> (source, target) language codes for LibreTranslate's
    routes (:mod:`seq2seq.serving.libretranslate`); a model not named there is not on them.
    """
    if not models:
        raise ValueError("no models to serve")
    served = dict(models)
    default_name = next(iter(served))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.batchers = {
            name: DynamicBatcher(m.translator, window_ms=window_ms, max_tokens=batch_tokens,
                                 name=name)
            for name, m in served.items()
        }
        app.state.shutting_down = False
        try:
            yield
        finally:
            app.state.shutting_down = True
            for batcher in app.state.batchers.values():
                await batcher.close()
            logger.info("batchers drained and stopped")

    app = FastAPI(
        title="seq2seq translation API",
        summary="Attention-based NMT: translations with scores and attention weights.",
        lifespan=lifespan,
    )
    app.state.served = served
    app.state.shutting_down = False
    # A body of max_chars characters fits within this, however it is written: a character is
    # at most 12 bytes, as a form's percent-encoded UTF-8 (4 bytes, %XX each) or JSON's \\u
    # escapes of a surrogate pair; plus max_lines strings' quoting and the other fields.
    app.add_middleware(BodyLimit, max_bytes=12 * max_chars + 64 * max_lines + 4096)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return JSONResponse({"error": error.message}, status_code=error.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        details = jsonable_encoder(error.errors(), exclude={"input", "ctx", "url"})
        first = details[0] if details else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        message = f"{where}: {first.get('msg', 'invalid request')}" if where else first.get(
            "msg", "invalid request")
        return JSONResponse({"error": message, "detail": details}, status_code=422)

    @app.get("/health", responses={503: ERRORS[503]})
    async def health() -> JSONResponse:
        if app.state.shutting_down:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        return JSONResponse({"status": "ok", "models": list(served)})

    @app.get("/v1/models", response_model=ModelsResponse)
    async def list_models() -> ModelsResponse:
        return ModelsResponse(
            default=default_name,
            terms=len(terms) if terms is not None else 0,
            models=[
                ModelInfo(name=name, scorer=m.scorer, parameters=m.parameters,
                          training=m.training, defaults=m.defaults(), attention=m.attention)
                for name, m in served.items()
            ],
        )

    @app.post("/v1/translate", response_model=TranslateResponse, responses=ERRORS,
              response_model_exclude_unset=True)
    async def translate(request: TranslateRequest) -> dict:
        name = request.model or default_name
        if name not in served:
            raise ApiError(404, f"unknown model {name!r}; models: {', '.join(served)}")
        if len(request.text) > max_lines:
            raise ApiError(413, f"{len(request.text)} sentences: at most {max_lines} per request")
        chars = sum(len(line) for line in request.text)
        if chars > max_chars:
            raise ApiError(413, f"{chars} characters: at most {max_chars} per request")
        options = options_of(request, served[name], max_beam_size)
        batchers = getattr(app.state, "batchers", None)
        if app.state.shutting_down or batchers is None:
            raise ApiError(503, "the server is shutting down")
        sentences = [one_line(line) for line in request.text]
        prefixes, constraints = steering_of(request, served[name].translator, options, sentences,
                                            terms)
        if not sentences:
            results = []
        else:
            try:
                results = await batchers[name].submit(
                    sentences, options, attention=request.attention,
                    attention_heads=request.attention and request.attention_heads,
                    prefixes=prefixes, constraints=constraints)
            except BatcherClosed as error:
                raise ApiError(503, str(error)) from None
            except Exception as error:
                logger.exception("translation failed")
                raise ApiError(500, f"translation failed: {type(error).__name__}") from None
        return {
            "model": name, "search": options.search, "beam_size": options.beam_size,
            "nbest": options.nbest,
            "translations": [_sentence(n_best, request.attention) for n_best in results],
        }

    add_libretranslate_routes(
        app, translate, languages or {}, max_beam_size=max_beam_size,
        beam_sizes={name: model.options.beam_size for name, model in served.items()})

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app
