"""Moved to :mod:`seq2seq.inference.search_loop`: this path still works, with a warning, until the next
release."""

from seq2seq.deprecation import moved

moved(__name__, "seq2seq.inference.search_loop", {"Choose": "Greedy", "Beams": "SearchState"})
