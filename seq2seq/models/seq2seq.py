"""The encoder-decoder model: encoder, attention decoder and output projection.

A translation is ``encode`` (memory, mask, final state, keys), ``init_state``, then
``decode_step`` per step, as :mod:`seq2seq.models.interfaces` spells out; training is
``features, weights = model(src, src_lengths, tgt_in)`` followed by ``model.project(features)``
on the positions that carry a target token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.data.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from seq2seq.models.decoders import AttentionDecoder
from seq2seq.models.encoder import RNNEncoder
from seq2seq.models.interfaces import DecodingModel, EncodedSource, State
from seq2seq.models.transformer import TransformerDecoder, TransformerEncoder


def drop_words(tokens: Tensor, p: float) -> Tensor:
    """Word dropout: each word piece becomes ``<unk>`` with probability ``p``.

    Padding, ``<s>`` and ``</s>`` are kept, so lengths and masks do not change. Whole input
    pieces are dropped (not embedding units), so the decoder cannot lean on the previous
    reference piece alone and the encoder learns to translate around unknown words.

    Shape:
        - tokens: (B, L) ids; output: (B, L)
    """
    droppable = (tokens != PAD_ID) & (tokens != BOS_ID) & (tokens != EOS_ID)
    dropped = droppable & (torch.rand(tokens.shape, device=tokens.device) < p)
    return tokens.masked_fill(dropped, UNK_ID)


class Seq2Seq(nn.Module, DecodingModel):
    """Attention-based encoder-decoder.

    Args:
        decoder: an attention decoder (:mod:`seq2seq.models.decoders`) or a Transformer
            decoder (:mod:`seq2seq.models.transformer`); its ``precompute_keys`` runs once per
            source batch.
        tie_embeddings: share the decoder's embedding matrix with the output projection
            (requires ``decoder.output_dim == decoder.embed_dim``).
        share_all_embeddings: one matrix for the source embeddings, the target embeddings and
            the output projection (Press & Wolf, 2017): ``tie_embeddings`` and the encoder's
            table too, which needs one vocabulary and one size on both sides.
        word_dropout: in training, the probability that a source or target input piece is
            replaced by ``<unk>`` (:func:`drop_words`); 0 turns it off.

    Shape:
        - src: (B, S), src_lengths: (B,) on any device, tgt_in: (B, T)
        - forward output: features (B, T, D) and attention weights (B, T, S)
        - project: (..., D) -> logits (..., V)
    """

    def __init__(
        self,
        *,
        encoder: RNNEncoder | TransformerEncoder,
        decoder: AttentionDecoder | TransformerDecoder,
        tie_embeddings: bool = False,
        share_all_embeddings: bool = False,
        word_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if not 0 <= word_dropout < 1:
            raise ValueError(f"word_dropout must be in [0, 1), got {word_dropout}")
        self.encoder = encoder
        self.decoder = decoder
        self.word_dropout = word_dropout
        vocab_size = decoder.embedding.num_embeddings
        tie_embeddings = tie_embeddings or share_all_embeddings
        self.generator = nn.Linear(decoder.output_dim, vocab_size, bias=not tie_embeddings)
        if tie_embeddings:
            if decoder.output_dim != decoder.embed_dim:
                raise ValueError(
                    "tie_embeddings needs the decoder's output size "
                    f"({decoder.output_dim}) to equal its embedding size ({decoder.embed_dim})"
                )
            self.generator.weight = decoder.embedding.weight
            # nn.Embedding's N(0, 1) init gives an output layer logits of std ~sqrt(d) and a
            # slow start; the usual N(0, 1/d) for shared matrices keeps them near 1.
            embedding = decoder.embedding
            nn.init.normal_(embedding.weight, mean=0.0, std=embedding.embedding_dim**-0.5)
            if embedding.padding_idx is not None:
                with torch.no_grad():
                    embedding.weight[embedding.padding_idx].zero_()
        if share_all_embeddings:
            source, target = encoder.embedding.weight, decoder.embedding.weight
            if source.shape != target.shape:
                raise ValueError(
                    "share_all_embeddings needs one vocabulary and one size on both sides: the "
                    f"source table is {tuple(source.shape)}, the target's {tuple(target.shape)} "
                    "(a joint tokenizer whose target side is not pruned)")
            encoder.embedding.weight = decoder.embedding.weight

    def encode(self, src: Tensor, src_lengths: Tensor) -> EncodedSource:
        memory, mask, final = self.encoder(src, src_lengths)
        keys = self.decoder.precompute_keys(memory)
        return EncodedSource(memory=memory, mask=mask, final=final, keys=keys)

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, *,
                need_weights: bool = True) -> tuple[Tensor, Tensor | None]:
        """Teacher-forced features and attention weights for a batch of pairs.

        ``need_weights=False`` lets a decoder skip computing weights it does not otherwise need
        (the Transformer's fused attention); it may then return ``None`` for them.
        """
        if self.training and self.word_dropout > 0:
            src, tgt_in = drop_words(src, self.word_dropout), drop_words(tgt_in, self.word_dropout)
        return self.decoder(tgt_in, self.encode(src, src_lengths), need_weights=need_weights)

    def project(self, features: Tensor, output_ids: Tensor | None = None) -> Tensor:
        """Output layer: features (..., D) -> logits (..., V), or (..., K) over the K target
        pieces ``output_ids`` only (a shortlist: the other rows are never computed)."""
        if output_ids is None:
            return self.generator(features)
        bias = self.generator.bias
        return F.linear(features, self.generator.weight.index_select(0, output_ids),
                        None if bias is None else bias.index_select(0, output_ids))

    def init_state(self, encoded: EncodedSource) -> State:
        return self.decoder.init_state(encoded.final)

    def decode_step(
        self, prev_tokens: Tensor, state: State, encoded: EncodedSource, *,
        output_ids: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, State]:
        """One decoding step: logits (B, V) (or (B, K) over ``output_ids``), attention weights
        (B, S) and the new state."""
        features, weights, state = self.decoder.step(prev_tokens, state, encoded)
        return self.project(features, output_ids), weights, state

    def attention_heads(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor) -> Tensor | None:
        """Every layer's and head's cross-attention (B, L, H, T, S) over whole targets, where the
        decoder has heads to show (the Transformer's); else None."""
        if not hasattr(self.decoder, "attention_heads"):
            return None
        return self.decoder.attention_heads(tgt_in, self.encode(src, src_lengths))
