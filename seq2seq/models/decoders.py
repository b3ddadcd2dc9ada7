"""Attention decoders: Bahdanau (attend, then step) and Luong (step, then attend).

Both offer the same two entry points:

- ``forward(tgt_in, encoded)``: teacher-forced decoding of a whole target batch (training);
- ``step(prev_tokens, state, encoded)``: one step, used by every search algorithm.

They compute the same thing: ``forward`` equals running ``step`` over the target, which the
tests check. The decoders return *features* (the vector the output layer reads); the
:class:`~seq2seq.models.seq2seq.Seq2Seq` model owns the output projection, so training can
project all target positions in one matrix product.

Decoder state is a dict of tensors whose first dimension is the batch, so a beam search can
reorder or repeat any state with one ``index_select`` per entry, whatever the decoder.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from seq2seq.models.attention import Attention
from seq2seq.models.encoder import make_rnn
from seq2seq.models.interfaces import State


class AttentionDecoder(nn.Module):
    """Parts shared by the decoders: embedding, RNN, the initial-state bridge and attention.

    Args:
        hidden_size: decoder RNN hidden size (also the attention query size).
        attention: the shared :class:`Attention` module wrapping a scorer.
        encoder_final_size: size of the encoder's final state fed to the bridge.
        rnn_input_size: input size of the RNN, set by the subclass.
        rnn_type: ``"gru"`` or ``"lstm"``.
        dropout: dropout on embeddings, between RNN layers and on the features.
        bridge: initial state ``tanh(W h_enc)`` from the encoder's final state (True) or zeros.
        output_dim: size of the features handed to the output layer (None: ``hidden_size``).
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        embed_dim: int,
        hidden_size: int,
        attention: Attention,
        encoder_final_size: int,
        rnn_input_size: int,
        num_layers: int = 1,
        rnn_type: str = "gru",
        dropout: float = 0.0,
        bridge: bool = True,
        output_dim: int | None = None,
        padding_idx: int = 0,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=padding_idx)
        self.rnn = make_rnn(
            rnn_type,
            input_size=rnn_input_size,
            hidden_size=hidden_size,
            num_layers=num_layers,
            dropout=dropout if num_layers > 1 else 0.0,
        )
        self.attention = attention
        self.dropout = nn.Dropout(dropout)
        self.is_lstm = rnn_type == "lstm"
        self.num_layers = num_layers
        self.hidden_size = hidden_size
        self.output_dim = output_dim or hidden_size
        self.embed_dim = embed_dim
        self.bridge = nn.Linear(encoder_final_size, num_layers * hidden_size) if bridge else None
        self.cell_bridge = (
            nn.Linear(encoder_final_size, num_layers * hidden_size)
            if bridge and self.is_lstm
            else None
        )

    def precompute_keys(self, memory: Tensor) -> Tensor:
        """The scorer's once-per-batch work on the memory (B, S, D_enc) (see the scorer contract)."""
        return self.attention.precompute_keys(memory)

    # -- state ---------------------------------------------------------------------------
    def init_state(self, final: Tensor) -> State:
        """The initial state from the encoder's final state ``final`` (B, D_enc)."""
        batch_size = final.size(0)

        def initial(layer: nn.Linear | None) -> Tensor:
            if layer is None:
                return final.new_zeros(batch_size, self.num_layers, self.hidden_size)
            return torch.tanh(layer(final)).view(batch_size, self.num_layers, self.hidden_size)

        state = {"hidden": initial(self.bridge)}  # (B, L, H)
        if self.is_lstm:
            state["cell"] = initial(self.cell_bridge)
        return state

    def _rnn(self, inputs: Tensor, state: State) -> tuple[Tensor, State]:
        """Run the RNN over ``inputs`` (B, T, I) from a batch-first ``state``; the new state is
        batch-first too."""

        def layer_first(x: Tensor) -> Tensor:  # (B, L, H) -> (L, B, H)
            return x.transpose(0, 1).contiguous()  # cuDNN refuses a strided state

        def batch_first(x: Tensor) -> Tensor:  # (L, B, H) -> (B, L, H)
            return x.transpose(0, 1)

        if self.is_lstm:
            state_in = (layer_first(state["hidden"]), layer_first(state["cell"]))
            output, (hidden, cell) = self.rnn(inputs, state_in)
            new_state = {"hidden": batch_first(hidden), "cell": batch_first(cell)}
        else:
            output, hidden = self.rnn(inputs, layer_first(state["hidden"]))
            new_state = {"hidden": batch_first(hidden)}
        return output, new_state  # output (B, T, H)

    def _embed(self, tokens: Tensor) -> Tensor:
        """Dropped-out embeddings of ``tokens`` (B, T) -> (B, T, E)."""
        return self.dropout(self.embedding(tokens))

    def step(
        self, prev_tokens: Tensor, state: State, encoded
    ) -> tuple[Tensor, Tensor, State]:
        """One decoder step.

        Shape:
            - prev_tokens: (B,) the previous target token (BOS at the first step)
            - state: dict of (B, ...) tensors from :meth:`init_state` or the last step
            - output: features (B, output_dim), attention weights (B, S), the new state
        """
        embedded = self._embed(prev_tokens.unsqueeze(1))  # (B, 1, E)
        features, weights, state = self._step(embedded, state, encoded)
        return features.squeeze(1), weights.squeeze(1), state

    def forward(self, tgt_in: Tensor, encoded, need_weights: bool = True) -> tuple[Tensor, Tensor]:
        """Teacher-forced decoding of whole targets.

        The weights come with the context whatever ``need_weights`` says (it is there for the
        Transformer decoder, which can skip them).

        Shape:
            - tgt_in: (B, T) BOS followed by the target tokens
            - output: features (B, T, output_dim), attention weights (B, T, S)
        """
        state = self.init_state(encoded.final)
        embedded = self._embed(tgt_in)  # (B, T, E), once for all steps
        features, weights = [], []
        for t in range(tgt_in.size(1)):
            step_features, step_weights, state = self._step(embedded[:, t : t + 1], state, encoded)
            features.append(step_features)
            weights.append(step_weights)
        return torch.cat(features, dim=1), torch.cat(weights, dim=1)

    def _step(self, embedded: Tensor, state: State, encoded) -> tuple[Tensor, Tensor, State]:
        raise NotImplementedError


class BahdanauDecoder(AttentionDecoder):
    """Bahdanau et al. (2015): attend with the previous state, then step.

    At step t, with the previous state s_{t-1} and previous target embedding e_{t-1}:
    ``c_t = attend(s_{t-1})``; ``s_t = RNN([e_{t-1}; c_t], s_{t-1})``; the features are
    ``tanh(W_o [s_t; c_t; e_{t-1}])``. The attention query is the top layer's state.

    Args:
        encoder_output_size: size of one encoder memory vector (the attention values).
        options: the rest of :class:`AttentionDecoder`'s arguments.

    Shape:
        see :meth:`AttentionDecoder.forward` and :meth:`AttentionDecoder.step`.
    """

    def __init__(self, *, embed_dim: int, encoder_output_size: int, **options) -> None:
        super().__init__(embed_dim=embed_dim, rnn_input_size=embed_dim + encoder_output_size,
                         **options)
        self.pre_output = nn.Linear(self.hidden_size + encoder_output_size + embed_dim,
                                    self.output_dim)

    def _step(self, embedded: Tensor, state: State, encoded) -> tuple[Tensor, Tensor, State]:
        query = state["hidden"][:, -1:]  # (B, 1, H): top layer of s_{t-1}
        context, weights = self.attention(query, encoded.keys, encoded.memory, encoded.mask)
        output, state = self._rnn(torch.cat([embedded, context], dim=-1), state)  # (B, 1, H)
        features = torch.tanh(self.pre_output(torch.cat([output, context, embedded], dim=-1)))
        return self.dropout(features), weights, state  # (B, 1, D), (B, 1, S)


class LuongDecoder(AttentionDecoder):
    """Luong et al. (2015): step, then attend with the new state.

    ``h_t = RNN(x_t, h_{t-1})``; ``c_t = attend(h_t)``; the attentional vector
    ``a_t = tanh(W_c [c_t; h_t])`` is the feature vector. With input feeding the RNN input is
    ``x_t = [e_{t-1}; a_{t-1}]``, otherwise ``x_t = e_{t-1}``; without input feeding nothing
    depends on the previous step's attention, so :meth:`forward` runs the RNN over the whole
    target in one call and attends for all steps in one batched product (no Python loop).

    Args:
        encoder_output_size: size of one encoder memory vector (the attention values).
        input_feeding: feed the last attentional vector to the RNN with the embedding.
        output_dim: size of the attentional vector (None: ``hidden_size``).
        options: the rest of :class:`AttentionDecoder`'s arguments.

    Shape:
        see :meth:`AttentionDecoder.forward` and :meth:`AttentionDecoder.step`.
    """

    def __init__(self, *, embed_dim: int, hidden_size: int, encoder_output_size: int,
                 input_feeding: bool = True, output_dim: int | None = None, **options) -> None:
        output_dim = output_dim or hidden_size
        super().__init__(embed_dim=embed_dim, hidden_size=hidden_size, output_dim=output_dim,
                         rnn_input_size=embed_dim + (output_dim if input_feeding else 0),
                         **options)
        self.input_feeding = input_feeding
        self.combine = nn.Linear(encoder_output_size + hidden_size, output_dim, bias=False)

    def init_state(self, final: Tensor) -> State:
        state = super().init_state(final)
        if self.input_feeding:
            state["feed"] = final.new_zeros(final.size(0), self.output_dim)  # a_0 = 0
        return state

    def _attend(self, output: Tensor, encoded) -> tuple[Tensor, Tensor]:
        """Attentional vectors for RNN outputs (B, T, H) -> (B, T, D), weights (B, T, S)."""
        context, weights = self.attention(output, encoded.keys, encoded.memory, encoded.mask)
        features = torch.tanh(self.combine(torch.cat([context, output], dim=-1)))
        return self.dropout(features), weights

    def _step(self, embedded: Tensor, state: State, encoded) -> tuple[Tensor, Tensor, State]:
        rnn_input = embedded
        if self.input_feeding:
            # a_t comes out of a step in the autocast dtype; a_0 and the embedding may be
            # float32 then, and cat needs one dtype.
            feed = state["feed"].unsqueeze(1)  # (B, 1, D)
            rnn_input = torch.cat([embedded, feed.to(embedded.dtype)], dim=-1)
        output, new_state = self._rnn(rnn_input, state)  # (B, 1, H)
        features, weights = self._attend(output, encoded)
        if self.input_feeding:
            new_state["feed"] = features.squeeze(1)
        return features, weights, new_state

    def forward(self, tgt_in: Tensor, encoded, need_weights: bool = True) -> tuple[Tensor, Tensor]:
        if self.input_feeding:
            return super().forward(tgt_in, encoded)
        # Fast path: one RNN call over all T steps, then one batched attention.
        embedded = self._embed(tgt_in)  # (B, T, E)
        output, _ = self._rnn(embedded, self.init_state(encoded.final))  # (B, T, H)
        return self._attend(output, encoded)
