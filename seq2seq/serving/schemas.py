"""The JSON shapes of the translation API (pydantic models; FastAPI derives the OpenAPI schema)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TranslateRequest(BaseModel):
    """``POST /v1/translate``: sentences and, optionally, decoding options and a model."""

    model_config = ConfigDict(extra="forbid")

    text: list[str] = Field(
        description="Sentences to translate, one per entry (line breaks inside become spaces).",
        examples=[["Ein Hund läuft.", "Zwei Männer spielen Fußball."]],
    )
    beam_size: int | None = Field(
        default=None, ge=1, description="Beams per sentence (1: greedy); the server's default if absent."
    )
    nbest: int | None = Field(
        default=None, ge=1, description="Hypotheses returned per sentence (at most beam_size)."
    )
    attention: bool = Field(
        default=False,
        description="Also return the source and target pieces and the attention weights.",
    )
    attention_heads: bool = Field(
        default=False,
        description="With attention: also return the best hypotheses' every layer's and head's "
        "cross-attention, where the model has several (a Transformer; absent for other models).",
    )
    model: str | None = Field(
        default=None, description="A name from GET /v1/models; the default model if absent."
    )


class Hypothesis(BaseModel):
    text: str
    score: float = Field(description="The length-penalised log-probability the search ranked by.")
    target_pieces: list[str] | None = Field(
        default=None, description="The output pieces without EOS (with attention only)."
    )
    attention: list[list[float]] | None = Field(
        default=None,
        description="Weights, one row per target piece plus EOS, one column per source piece "
        "plus EOS (with attention only; null for an empty sentence). A Transformer's are "
        "the mean over its layers and heads.",
    )
    attention_heads: list[list[list[list[float]]]] | None = Field(
        default=None,
        description="With attention_heads, on a sentence's best hypothesis: [layer][head] "
        "matrices shaped like attention.",
    )


class SentenceTranslation(BaseModel):
    text: str = Field(description="The best translation.")
    score: float = Field(description="Its score.")
    source_pieces: list[str] | None = Field(
        default=None, description="The source pieces the model read, without EOS (with attention)."
    )
    hypotheses: list[Hypothesis] = Field(description="Up to nbest translations, best first.")


class TranslateResponse(BaseModel):
    model: str
    beam_size: int
    nbest: int
    translations: list[SentenceTranslation] = Field(description="One entry per input, in order.")


class ModelInfo(BaseModel):
    name: str
    scorer: str | None = Field(
        description="The attention scorer's class, e.g. AdditiveScorer (TransformerDecoder for a "
        "Transformer, whose decoder brings its own multi-head attention).")
    parameters: int = Field(description="Number of model parameters.")
    training: dict | None = Field(
        description="The trainer's summary saved in the checkpoint (steps, best BLEU, ...), "
        "or null when the checkpoint carries none."
    )
    defaults: dict = Field(description="The decoding options a request gets unless it sets them.")


class ModelsResponse(BaseModel):
    default: str
    models: list[ModelInfo]


class ErrorResponse(BaseModel):
    error: str
