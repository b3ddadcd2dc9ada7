"""LibreTranslate's API on the translation server, for the clients written for LibreTranslate.

:func:`add_libretranslate_routes` adds ``POST /translate``, ``POST /detect`` and
``GET /languages`` to the app of :mod:`seq2seq.serving.app`; what they take and answer, and where
they differ from LibreTranslate: docs/serving.md, "LibreTranslate API". Every translation goes
through ``/v1/translate``'s handler (:func:`_translations`), so its limits, batcher, defaults and
glossary apply and the answers are its own; its 422 becomes LibreTranslate's 400, its 413, 503
and 500 stay.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from fastapi import APIRouter, FastAPI, Request

from seq2seq.checkpoint import LANGUAGE_NAMES
from seq2seq.serving.errors import ApiError
from seq2seq.serving.schemas import TranslateRequest

AUTO = "auto"  # LibreTranslate's source for "detect it"
CONFIDENCE = 100.0  # of the one source language served: no detector guesses it
NO_LANGUAGES = ("no model served records its languages: start serve.py with src_lang=CODE "
                "tgt_lang=CODE")

Translate = Callable[[TranslateRequest], Awaitable[dict]]


async def _fields(request: Request) -> dict:
    """The request's fields, from a JSON object or a form (LibreTranslate takes either)."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type == "application/json" or media_type.endswith("+json"):
        try:
            fields = await request.json()
        except ValueError as error:
            raise ApiError(400, f"invalid JSON: {error}") from None
        if not isinstance(fields, dict):
            raise ApiError(400, "invalid JSON: the body must be an object")
        return fields
    return dict(await request.form())


def _text(fields: dict) -> str | list[str]:
    """``q``: a non-empty text or list of texts (LibreTranslate refuses an empty one)."""
    q = fields.get("q")
    if not q:
        raise ApiError(400, "missing q: the text to translate")
    if not (isinstance(q, str) or isinstance(q, list) and all(isinstance(t, str) for t in q)):
        raise ApiError(400, "q: a string or a list of strings")
    return q


def _required(fields: dict, name: str) -> str:
    value = fields.get(name)
    if not value or not isinstance(value, str):
        raise ApiError(400, f"missing {name}: a language code (GET /languages lists them)")
    return value


def _alternatives(value, most: int) -> int:
    """``alternatives``: a whole number up to ``most``, 0 where absent (and, as LibreTranslate,
    where negative). A JSON ``true`` or ``2.9`` is no count."""
    if value is None or value == "":
        return 0
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ApiError(400, f"alternatives: {value!r} is not a whole number")
    try:
        count = max(0, int(value))
    except (TypeError, ValueError):
        raise ApiError(400, f"alternatives: {value!r} is not a whole number") from None
    if count > most:
        raise ApiError(400, f"alternatives: at most {most}, got {count}")
    return count


def _only_source(pairs: Mapping[str, tuple[str, str]]) -> str:
    """The one source language served: what ``auto`` and ``/detect`` name, having no detector."""
    sources = list(dict.fromkeys(source for source, _ in pairs.values()))
    if not sources:
        raise ApiError(400, NO_LANGUAGES)
    if len(sources) > 1:
        raise ApiError(400, f"cannot detect the language: this server has no detector and "
                            f"serves several sources ({', '.join(sources)}): name the source")
    return sources[0]


def _model_for(pairs: Mapping[str, tuple[str, str]], source: str, target: str) -> str:
    """The first model serving ``source`` -> ``target``."""
    if not pairs:
        raise ApiError(400, NO_LANGUAGES)
    for name, pair in pairs.items():
        if pair == (source, target):
            return name
    served = ", ".join(f"{s}->{t}" for s, t in dict.fromkeys(pairs.values()))
    raise ApiError(400, f"{source}->{target} is not served; this server translates {served}")


async def _translations(translate: Translate, model: str, texts: list[str],
                        alternatives: int, beam_size: int) -> list[list[str]]:
    """Each text's translations, best first (the best and up to ``alternatives`` more), from
    ``/v1/translate``'s handler: its limits, batcher, defaults and glossary; ``beam_size``: the
    model's, widened to the translations asked for. The one place this module asks for
    translations."""
    wanted = alternatives + 1
    request = TranslateRequest(text=texts, model=model, nbest=wanted if alternatives else None,
                               beam_size=wanted if wanted > beam_size else None)
    try:
        reply = await translate(request)
    except ApiError as error:
        if error.status != 422:
            raise
        raise ApiError(400, error.message) from None  # LibreTranslate's status for a bad request
    return [[hypothesis["text"] for hypothesis in entry["hypotheses"]]
            for entry in reply["translations"]]


def add_libretranslate_routes(app: FastAPI, translate: Translate,
                              languages: Mapping[str, tuple[str, str]], *,
                              beam_sizes: Mapping[str, int], max_beam_size: int) -> None:
    """Add LibreTranslate's ``/translate``, ``/detect`` and ``/languages`` to ``app`` (whose
    handler answers :class:`ApiError` with ``{"error": ...}``), translating through its
    ``/v1/translate`` handler ``translate``. ``languages``: model name -> (source code, target
    code) of the models whose languages are known, in the order served (the others are not
    reachable here); ``beam_sizes``: each model's default beam, widened for more
    ``alternatives`` up to ``max_beam_size`` (so ``alternatives`` up to one less)."""
    pairs = dict(languages)
    router = APIRouter(tags=["LibreTranslate"])

    @router.get("/languages")
    async def list_languages() -> list[dict]:
        """Every language served, each with the targets it translates into."""
        if not pairs:
            raise ApiError(400, NO_LANGUAGES)
        targets: dict[str, set[str]] = {}
        for source, target in pairs.values():
            targets.setdefault(source, set()).add(target)
            targets.setdefault(target, set())
        return [{"code": code, "name": LANGUAGE_NAMES.get(code, code), "targets": sorted(found)}
                for code, found in targets.items()]

    @router.post("/detect")
    async def detect(request: Request) -> list[dict]:
        """The one source language served, with confidence 100 (``q`` is required, not read)."""
        _text(await _fields(request))
        return [{"confidence": CONFIDENCE, "language": _only_source(pairs)}]

    @router.post("/translate")
    async def translate_text(request: Request) -> dict:
        """LibreTranslate's ``/translate`` (see the module docstring)."""
        fields = await _fields(request)
        q = _text(fields)
        source, target = _required(fields, "source"), _required(fields, "target")
        alternatives = _alternatives(fields.get("alternatives"), max_beam_size - 1)
        text_format = fields.get("format") or "text"
        if text_format != "text":
            raise ApiError(400, f"format {text_format!r} is not supported: this server "
                                "translates plain text (format=text)")
        language = _only_source(pairs) if source == AUTO else source
        model = _model_for(pairs, language, target)
        texts = q if isinstance(q, list) else [q]
        found = await _translations(translate, model, texts, alternatives, beam_sizes[model])
        best = [translations[0] for translations in found]
        # As LibreTranslate: each alternative once, neither empty nor the best itself.
        others = [[t for t in dict.fromkeys(translations[1:]) if t and t != translations[0]]
                  for translations in found]
        batch = isinstance(q, list)
        reply: dict = {"translatedText": best if batch else best[0]}
        if alternatives:
            reply["alternatives"] = others if batch else others[0]
        if source == AUTO:
            detected = {"confidence": CONFIDENCE, "language": language}
            reply["detectedLanguage"] = [detected] * len(texts) if batch else detected
        return reply

    app.include_router(router)
