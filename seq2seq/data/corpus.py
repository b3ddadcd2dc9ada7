"""Moved to :mod:`seq2seq.data.text_files`: this path still works, with a warning, until the next
release."""

from seq2seq.deprecation import moved

moved(__name__, "seq2seq.data.text_files")
