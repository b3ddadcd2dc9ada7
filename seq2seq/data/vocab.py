"""Fixed ids of the special pieces, shared by every sentencepiece model of the framework.

The ids are fixed (not looked up per model) so that padding, the decoder's start symbol and
the end-of-sentence check are the same for joint and per-side vocabularies alike.
"""

from __future__ import annotations

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3

PAD_PIECE = "<pad>"
UNK_PIECE = "<unk>"
BOS_PIECE = "<s>"
EOS_PIECE = "</s>"
