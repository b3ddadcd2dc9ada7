"""The Transformer (Vaswani et al., 2017): a self-attention encoder and decoder.

Both are stacks of pre-norm layers (Wang et al., 2019: the layer norm opens each sub-layer, and
one more closes the stack), which train without the long warmup post-norm layers need::

    x = x + Dropout(SelfAttention(LayerNorm(x)))
    x = x + Dropout(CrossAttention(LayerNorm(x), memory))        # decoder only
    x = x + Dropout(FeedForward(LayerNorm(x)))

Tokens enter as ``sqrt(d_model) * embedding + sinusoidal position`` (:func:`embed`). Attention is multi-head
scaled dot-product attention, ``softmax(Q K^T / sqrt(d_head)) V`` per head, computed by
``torch.nn.functional.scaled_dot_product_attention`` (fused kernels on GPUs) wherever its
weights are not needed; the decoder's cross-attention weights are computed by the formula when
asked for (every decoding step: they are what the heatmaps show).

The decoder fits the interface of the RNN decoders (:mod:`seq2seq.models.decoders`), so the
same training loop, searches and export drive it:

- ``precompute_keys(memory)`` projects the memory into every layer's cross-attention keys and
  values once per source batch;
- its state is the self-attention cache: every layer's keys and values of the target prefix,
  (B, L, H, T, Dh) each, which grows by one position per step; beam search reorders it like any
  state, with ``index_select`` on dim 0.

A Transformer encoder also drives the RNN decoders (its memory is just memory) and an RNN
encoder drives the Transformer decoder (the cross-attention projects any memory size).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.models.encoder import EncoderOutput, source_mask
from seq2seq.models.interfaces import State


def sinusoidal_positions(positions: Tensor, dim: int) -> Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/dim)), PE[p, 2i+1] = cos(p / 10000^(2i/dim)).

    Computed for the positions asked for, so there is no longest sentence.

    Shape:
        - positions: (T,) integers; output: (T, dim) float32
    """
    rates = torch.exp(torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32)
                      * (-math.log(10000.0) / dim))  # (dim/2,)
    angles = positions.to(torch.float32).unsqueeze(1) * rates  # (T, dim/2)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)  # (T, dim), interleaved


def make_embedding(vocab_size: int, d_model: int, padding_idx: int) -> nn.Embedding:
    """A table that starts as N(0, 1/d_model): scaled by sqrt(d_model) (:func:`embed`) its rows
    have unit size, like the positions added to them and like a tied output layer's rows."""
    if d_model % 2:
        raise ValueError(f"d_model must be even (sinusoidal positions), got {d_model}")
    embedding = nn.Embedding(vocab_size, d_model, padding_idx=padding_idx)
    nn.init.normal_(embedding.weight, mean=0.0, std=d_model**-0.5)
    with torch.no_grad():
        embedding.weight[padding_idx].zero_()
    return embedding


def embed(embedding: nn.Embedding, tokens: Tensor, positions: Tensor) -> Tensor:
    """``sqrt(d_model) * E[token] + PE[position]``: tokens (B, T), positions (T,) -> (B, T, D)."""
    embedded = embedding(tokens) * math.sqrt(embedding.embedding_dim)
    return embedded + sinusoidal_positions(positions, embedding.embedding_dim)


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention with separate query, key and value projections.

    Args:
        d_model: size of the queries and of the output.
        num_heads: heads H; each has d_model / H dimensions.
        key_dim: size of the vectors keys and values are projected from; ``None``: d_model.
        dropout: dropout on the attention weights.

    Shape:
        - project_keys_values: (B, S, key_dim) -> keys and values, (B, H, S, Dh) each
        - forward: query input (B, T, D), keys and values (B, H, S, Dh), mask (B, S) ->
          output (B, T, D) and, when asked for, weights (B, H, T, S)
    """

    def __init__(self, *, d_model: int, num_heads: int, key_dim: int | None = None,
                 dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
        key_dim = d_model if key_dim is None else key_dim
        self.num_heads = num_heads
        self.query_proj = nn.Linear(d_model, d_model)
        self.key_proj = nn.Linear(key_dim, d_model)
        self.value_proj = nn.Linear(key_dim, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = dropout
        for layer in (self.query_proj, self.key_proj, self.value_proj, self.out_proj):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, H, T, D/H)."""
        B, T, D = x.shape
        return x.view(B, T, self.num_heads, D // self.num_heads).transpose(1, 2)

    def project_keys_values(self, source: Tensor) -> tuple[Tensor, Tensor]:
        return self.split_heads(self.key_proj(source)), self.split_heads(self.value_proj(source))

    def normalize(self, energies: Tensor) -> Tensor:
        """Weights from energies (B, H, T, S), -inf at masked keys: the softmax."""
        return torch.softmax(energies, dim=-1)

    def attend(self, query: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None, *,
               causal: bool, dropout: float) -> Tensor:
        """softmax(Q K^T / sqrt(Dh)) V, in one fused call: (B, H, T, Dh) from the queries."""
        return F.scaled_dot_product_attention(
            query, keys, values, dropout_p=dropout, is_causal=causal,
            attn_mask=None if mask is None else mask[:, None, None, :])

    def forward(self, x: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None = None, *,
                causal: bool = False, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """Attend from the T positions of ``x`` over the S keys (True in ``mask``: a real key).

        ``causal``: position t sees keys 0..t only (T = S). Every query needs a real key.
        """
        query = self.split_heads(self.query_proj(x))  # (B, H, T, Dh)
        dropout = self.dropout if self.training else 0.0
        if need_weights:
            energies = query @ keys.transpose(-2, -1) / math.sqrt(query.size(-1))  # (B, H, T, S)
            energies = energies.float()  # normalize in float32 under autocast
            if mask is not None:
                energies = energies.masked_fill(~mask[:, None, None, :], float("-inf"))
            if causal:
                T, S = energies.shape[-2:]
                future = torch.ones(T, S, dtype=torch.bool, device=x.device).triu(1)
                energies = energies.masked_fill(future, float("-inf"))
            weights = self.normalize(energies).to(values.dtype)
            context = F.dropout(weights, dropout, self.training) @ values  # (B, H, T, Dh)
        else:
            weights = None
            context = self.attend(query, keys, values, mask, causal=causal, dropout=dropout)
        B, H, T, Dh = context.shape
        output = self.out_proj(context.transpose(1, 2).reshape(B, T, H * Dh))  # heads joined
        return output, weights


class FeedForward(nn.Sequential):
    """Position-wise ``W_2 Dropout(ReLU(W_1 x))``: (B, T, D) -> (B, T, D)."""

    def __init__(self, d_model: int, ffn_dim: int, dropout: float) -> None:
        super().__init__(nn.Linear(d_model, ffn_dim), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(ffn_dim, d_model))


class TransformerEncoderLayer(nn.Module):
    """Pre-norm self-attention and feed-forward sub-layers with residual connections."""

    def __init__(self, d_model: int, num_heads: int, ffn_dim: int, dropout: float,
                 attention_dropout: float) -> None:
        super().__init__()
        self.self_attention_norm = nn.LayerNorm(d_model)
        self.self_attention = MultiHeadAttention(d_model=d_model, num_heads=num_heads,
                                                 dropout=attention_dropout)
        self.feed_forward_norm = nn.LayerNorm(d_model)
        self.feed_forward = FeedForward(d_model, ffn_dim, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x (B, S, D), mask (B, S) True at real positions -> (B, S, D)."""
        h = self.self_attention_norm(x)
        keys, values = self.self_attention.project_keys_values(h)
        x = x + self.dropout(self.self_attention(h, keys, values, mask)[0])
        return x + self.dropout(self.feed_forward(self.feed_forward_norm(x)))


class TransformerEncoder(nn.Module):
    """Embeddings, ``num_layers`` encoder layers and a final layer norm.

    Args:
        d_model: size of every position's vector.
        num_heads: attention heads per layer.
        ffn_dim: hidden size of the feed-forward sub-layers.
        dropout: dropout on the embeddings, the sub-layers' outputs and inside the feed-forward.
        attention_dropout: dropout on the attention weights.

    Shape:
        - src: (B, S) token ids, padded; src_lengths: (B,)
        - output: :class:`EncoderOutput` with memory (B, S, d_model), zeros at padding, mask
          (B, S) and final (B, d_model): the mean of the memory over the real positions, for
          decoders that start from the encoder's final state (the RNN decoders' bridge)
    """

    def __init__(self, *, vocab_size: int, d_model: int = 256, num_heads: int = 4,
                 num_layers: int = 3, ffn_dim: int = 1024, dropout: float = 0.1,
                 attention_dropout: float = 0.0, padding_idx: int = 0) -> None:
        super().__init__()
        self.embedding = make_embedding(vocab_size, d_model, padding_idx)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            TransformerEncoderLayer(d_model, num_heads, ffn_dim, dropout, attention_dropout)
            for _ in range(num_layers)
        )
        self.final_norm = nn.LayerNorm(d_model)
        self.output_size = d_model

    def forward(self, src: Tensor, src_lengths: Tensor) -> EncoderOutput:
        lengths = src_lengths.to(src.device)
        mask = source_mask(lengths, src.size(1))  # (B, S)
        positions = torch.arange(src.size(1), device=src.device)
        x = self.dropout(embed(self.embedding, src, positions))  # (B, S, D)
        for layer in self.layers:
            x = layer(x, mask)
        memory = self.final_norm(x) * mask.unsqueeze(-1)  # (B, S, D), zeros at padding
        final = memory.sum(dim=1) / lengths.unsqueeze(1).to(memory.dtype)  # (B, D)
        return EncoderOutput(memory=memory, mask=mask, final=final)


class TransformerDecoderLayer(nn.Module):
    """Pre-norm causal self-attention, cross-attention and feed-forward sub-layers."""

    def __init__(self, d_model: int, num_heads: int, ffn_dim: int, dropout: float,
                 attention_dropout: float, memory_size: int) -> None:
        super().__init__()
        self.self_attention_norm = nn.LayerNorm(d_model)
        self.self_attention = MultiHeadAttention(d_model=d_model, num_heads=num_heads,
                                                 dropout=attention_dropout)
        self.cross_attention_norm = nn.LayerNorm(d_model)
        self.cross_attention = MultiHeadAttention(d_model=d_model, num_heads=num_heads,
                                                  key_dim=memory_size, dropout=attention_dropout)
        self.feed_forward_norm = nn.LayerNorm(d_model)
        self.feed_forward = FeedForward(d_model, ffn_dim, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, past: tuple[Tensor, Tensor] | None, cross: tuple[Tensor, Tensor],
                memory_mask: Tensor, need_weights: bool
                ) -> tuple[Tensor, tuple[Tensor, Tensor], Tensor | None]:
        """Decode T new target positions.

        Args:
            x: the new positions' inputs (B, T, D).
            past: the keys and values of the positions before them, (B, H, P, Dh) each, or
                ``None`` for a whole target at once (then each position sees only the earlier
                ones: a causal mask).
            cross: this layer's cross-attention keys and values, (B, H, S, Dh) each.
            memory_mask: (B, S) True at real source positions.
            need_weights: compute the cross-attention weights (B, H, T, S).

        Returns:
            The outputs (B, T, D), the self-attention keys and values of all P + T positions
            (the next step's ``past``) and the weights or ``None``.
        """
        h = self.self_attention_norm(x)
        keys, values = self.self_attention.project_keys_values(h)  # (B, H, T, Dh) each
        if past is not None:
            keys = torch.cat([past[0].to(keys.dtype), keys], dim=2)  # (B, H, P + T, Dh)
            values = torch.cat([past[1].to(values.dtype), values], dim=2)
        x = x + self.dropout(self.self_attention(h, keys, values, causal=past is None)[0])
        context, weights = self.cross_attention(self.cross_attention_norm(x), *cross, memory_mask,
                                                need_weights=need_weights)
        x = x + self.dropout(context)
        x = x + self.dropout(self.feed_forward(self.feed_forward_norm(x)))
        return x, (keys, values), weights


class TransformerDecoder(nn.Module):
    """Embeddings, ``num_layers`` decoder layers and a final layer norm; the features it returns
    go to the model's output layer.

    The attention weights it returns (for heatmaps, the page and the study's statistics) are
    the cross-attention weights averaged over every head of every layer.

    Args:
        encoder_output_size: size of one memory vector (the encoder's ``output_size``).
        d_model, num_heads, ffn_dim, dropout, attention_dropout: as for
            :class:`TransformerEncoder`.

    Shape:
        - forward: tgt_in (B, T) -> features (B, T, d_model), weights (B, T, S) or ``None``
        - step: prev_tokens (B,) -> features (B, d_model), weights (B, S), the new state
        - state: ``self_keys`` and ``self_values``, (B, L, H, T, Dh) each, T decoded positions
        - precompute_keys: memory (B, S, Dm) -> (B, L, 2, H, S, Dh), each layer's
          cross-attention keys (index 0) and values (index 1)
    """

    def __init__(self, *, vocab_size: int, encoder_output_size: int, d_model: int = 256,
                 num_heads: int = 4, num_layers: int = 3, ffn_dim: int = 1024,
                 dropout: float = 0.1, attention_dropout: float = 0.0,
                 padding_idx: int = 0) -> None:
        super().__init__()
        self.embedding = make_embedding(vocab_size, d_model, padding_idx)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            TransformerDecoderLayer(d_model, num_heads, ffn_dim, dropout, attention_dropout,
                                    encoder_output_size)
            for _ in range(num_layers)
        )
        self.final_norm = nn.LayerNorm(d_model)
        self.num_heads = num_heads
        self.embed_dim = self.output_dim = d_model

    def precompute_keys(self, memory: Tensor) -> Tensor:
        """Every layer's cross-attention keys and values, once per source batch."""
        return torch.stack([torch.stack(layer.cross_attention.project_keys_values(memory), dim=1)
                            for layer in self.layers], dim=1)  # (B, L, 2, H, S, Dh)

    def init_state(self, final: Tensor) -> State:
        """An empty cache for the B sentences of ``final`` (B, *)."""
        L, D = len(self.layers), self.output_dim
        empty = final.new_zeros(final.size(0), L, self.num_heads, 0, D // self.num_heads)
        return {"self_keys": empty, "self_values": empty}

    def _layers(self, x: Tensor, state: State | None, encoded, need_weights: bool
                ) -> tuple[Tensor, State | None, Tensor | None]:
        """Run the stack over new positions ``x`` (B, T, D) after the cached ones in ``state``,
        or over a whole target when ``state`` is ``None`` (then no cache is returned); the
        weights are every layer's and head's, (B, L, H, T, S)."""
        past_keys, past_values, all_weights = [], [], []
        for number, layer in enumerate(self.layers):
            past = None if state is None else (state["self_keys"][:, number],
                                               state["self_values"][:, number])
            cross = (encoded.keys[:, number, 0], encoded.keys[:, number, 1])  # (B, H, S, Dh)
            x, (keys, values), weights = layer(x, past, cross, encoded.mask, need_weights)
            past_keys.append(keys)
            past_values.append(values)
            all_weights.append(weights)
        new_state = None if state is None else {
            "self_keys": torch.stack(past_keys, dim=1),  # (B, L, H, T, Dh)
            "self_values": torch.stack(past_values, dim=1),
        }
        weights = torch.stack(all_weights, dim=1) if need_weights else None
        return self.final_norm(x), new_state, weights  # weights (B, L, H, T, S)

    def step(self, prev_tokens: Tensor, state: State, encoded) -> tuple[Tensor, Tensor, State]:
        """One decoding step from the cache of the positions decoded so far."""
        position = state["self_keys"].size(3)  # positions in the cache
        positions = torch.arange(position, position + 1, device=prev_tokens.device)
        x = self.dropout(embed(self.embedding, prev_tokens.unsqueeze(1), positions))  # (B, 1, D)
        features, state, weights = self._layers(x, state, encoded, need_weights=True)
        return features.squeeze(1), weights.mean(dim=(1, 2)).squeeze(1), state

    def forward(self, tgt_in: Tensor, encoded, need_weights: bool = True
                ) -> tuple[Tensor, Tensor | None]:
        """Teacher-forced decoding of whole targets in one pass (a causal mask, no loop).

        Padding after a target's end changes none of its positions: they only see earlier ones.
        """
        features, weights = self._whole_targets(tgt_in, encoded, need_weights)
        return features, None if weights is None else weights.mean(dim=(1, 2))  # (B, T, S)

    def attention_heads(self, tgt_in: Tensor, encoded) -> Tensor:
        """Every layer's and head's cross-attention weights over whole targets (teacher
        forcing: what a search saw at each step of the translation it made), for the heatmaps'
        layer and head picker. Their mean over layers and heads is what :meth:`forward` returns.

        Shape:
            - tgt_in: (B, T); output: (B, L, H, T, S)
        """
        return self._whole_targets(tgt_in, encoded, need_weights=True)[1]

    def _whole_targets(self, tgt_in: Tensor, encoded, need_weights: bool
                       ) -> tuple[Tensor, Tensor | None]:
        positions = torch.arange(tgt_in.size(1), device=tgt_in.device)
        x = self.dropout(embed(self.embedding, tgt_in, positions))  # (B, T, D)
        features, _, weights = self._layers(x, None, encoded, need_weights)
        return features, weights
