"""The translation API and its web page: ``create_app(models)`` builds the ASGI app.

Endpoints (FastAPI documents them at ``/docs`` and ``/openapi.json``):

- ``POST /v1/translate``: ``{"text": [...], "beam_size"?, "nbest"?, "attention"?,
  "attention_heads"?, "model"?}``
  -> one entry per sentence, in order (see :mod:`seq2seq.serving.schemas`).
- ``GET /v1/models``: names, attention scorer, parameter count, training summary, defaults.
- ``GET /health``: 200 while serving, 503 once shutting down.
- ``GET /``: the page (``static/``): translate, and explore each sentence's attention.

Errors are JSON ``{"error": "..."}``: 413 for a request over ``max_lines`` sentences or
``max_chars`` characters (or a body too large to be one), 422 for malformed JSON, wrong
types or invalid options, 404 for an unknown model, 503 while shutting down, 500 when a
decode fails (the server and the other requests carry on). Clients only ever pick among the
models configured at start, by name.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from seq2seq.serving.batcher import BatcherClosed, DynamicBatcher
from seq2seq.serving.models import ServedModel
from seq2seq.serving.schemas import (
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


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


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


def _hypothesis(translation, attention: bool) -> dict:
    item = {"text": translation.text, "score": float(translation.score)}
    if attention:
        item["target_pieces"] = list(translation.target_pieces)
        weights = translation.attention
        item["attention"] = (
            None if weights is None else weights.float().cpu().numpy().round(4).tolist()
        )
        heads = getattr(translation, "attention_heads", None)
        if heads is not None:
            item["attention_heads"] = heads.float().cpu().numpy().round(4).tolist()
    return item


def _sentence(n_best, attention: bool) -> dict:
    best = n_best[0]
    entry = {"text": best.text, "score": float(best.score),
             "hypotheses": [_hypothesis(t, attention) for t in n_best]}
    if attention:
        entry["source_pieces"] = list(best.source_pieces)
    return entry


def create_app(
    models: Mapping[str, object],
    *,
    max_lines: int = 64,
    max_chars: int = 20000,
    max_beam_size: int = 16,
    window_ms: float = 5.0,
    batch_tokens: int = 8000,
) -> FastAPI:
    """The ASGI app serving ``models``.

    Args:
        models: name -> :class:`ServedModel` or a bare Translator; the first is the default.
            The Translators' own options (``beam_size``, ``nbest``, ...) are the defaults.
        max_lines: most sentences per request (more: 413).
        max_chars: most characters per request, all sentences together (more: 413).
        max_beam_size: largest ``beam_size`` a request may ask for (more: 422).
        window_ms: the batcher's collection window.
        batch_tokens: the batcher's budget of source pieces per round.
    """
    if not models:
        raise ValueError("no models to serve")
    served = {name: m if isinstance(m, ServedModel) else ServedModel.wrap(m)
              for name, m in models.items()}
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
    # A JSON body of max_chars characters of UTF-8 (up to 4 bytes, or 6 as \\u escapes) and
    # max_lines strings fits well within this.
    app.add_middleware(BodyLimit, max_bytes=6 * max_chars + 64 * max_lines + 4096)

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
            models=[
                ModelInfo(name=name, scorer=m.scorer, parameters=m.parameters,
                          training=m.training, defaults=m.defaults())
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
        translator = served[name].translator
        beam_size = request.beam_size or translator.beam_size
        if beam_size > max_beam_size:
            raise ApiError(422, f"beam_size: at most {max_beam_size}, got {beam_size}")
        nbest = request.nbest or min(translator.nbest, beam_size)
        if nbest > beam_size:
            raise ApiError(422, f"nbest: at most beam_size ({beam_size}), got {nbest}")
        batchers = getattr(app.state, "batchers", None)
        if app.state.shutting_down or batchers is None:
            raise ApiError(503, "the server is shutting down")
        sentences = [" ".join(line.splitlines()) for line in request.text]
        if not sentences:
            results = []
        else:
            try:
                results = await batchers[name].submit(
                    sentences, beam_size=beam_size, nbest=nbest, attention=request.attention,
                    attention_heads=request.attention and request.attention_heads,
                )
            except BatcherClosed as error:
                raise ApiError(503, str(error)) from None
            except Exception as error:
                logger.exception("translation failed")
                raise ApiError(500, f"translation failed: {type(error).__name__}") from None
        return {
            "model": name, "beam_size": beam_size, "nbest": nbest,
            "translations": [_sentence(n_best, request.attention) for n_best in results],
        }

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app
