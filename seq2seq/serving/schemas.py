"""The JSON shapes of the translation API (pydantic models; FastAPI derives the OpenAPI schema)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, create_model

from seq2seq.inference.decode_options import described_options

# The decoding options a request may set: all of DecodeOptions' but the output length limit,
# which bounds what a request costs and stays the server's (serve.py max_len_a=, max_len_b=).
REQUEST_OPTIONS = tuple(name for name in described_options()
                        if name not in ("max_len_a", "max_len_b"))


class TranslateFields(BaseModel):
    """``POST /v1/translate``'s own fields: the sentences, what comes back, the model, and what
    steers each sentence (the decoding options are :class:`TranslateRequest`'s)."""

    model_config = ConfigDict(extra="forbid")

    text: list[str] = Field(
        description="Sentences to translate, one per entry (line breaks inside become spaces).",
        examples=[["Ein Hund läuft.", "Zwei Männer spielen Fußball."]],
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
    prefix: list[str] | None = Field(
        default=None,
        description="One per text: the text its translations start with (\"\" for none).",
        examples=[["A dog", ""]],
    )
    constraints: list[list[str]] | None = Field(
        default=None,
        description="One list per text: phrases its translations must contain (search=beam); "
        "the server's terms, if it has any, are added.",
        examples=[[["dog"], []]],
    )


# DecodeOptions declares the options (their types, meanings and checks: a value out of range
# gets its one-line 422 from there, naming the option); here each is optional.
def _request_field(kind, meaning: str):
    return kind | None, Field(default=None,
                              description=f"{meaning} Absent: the model's default (GET /v1/models).")


TranslateRequest = create_model(
    "TranslateRequest", __base__=TranslateFields,
    __doc__="``POST /v1/translate``: sentences and, optionally, decoding options and a model.",
    **{name: _request_field(kind, meaning)
       for name, (kind, _, meaning) in described_options().items() if name in REQUEST_OPTIONS})


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
    search: str = Field(description="The search that found the translations: beam, sample, ...")
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
    attention: str | None = Field(
        default=None,
        description="What the attention matrices show where they are not the model's own "
        "cross-attention (a CTranslate2 folder: its alignment head, one layer's one head; no "
        "attention_heads); null: the model's own (a Transformer's: the mean of its layers and "
        "heads).")


class ModelsResponse(BaseModel):
    default: str
    models: list[ModelInfo]
    terms: int = Field(
        default=0, description="Entries of the glossary the server applies to every request "
        "(serve.py terms=FILE): a text holding a source term is translated with its target term "
        "in it. 0: none.")


class ErrorResponse(BaseModel):
    error: str
