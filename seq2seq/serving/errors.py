"""The API's one error: an HTTP status and a one-line reason, answered as ``{"error": reason}``
(the handler is :func:`seq2seq.serving.app.create_app`'s). Its own module, so that the routes of
:mod:`seq2seq.serving.app` and :mod:`seq2seq.serving.libretranslate` share it without importing
each other."""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
