"""Put a :class:`Seq2Seq` together from the ``model`` config node.

This is the one place the model's parts are instantiated from config (``_target_``), so a
user plugs in their own encoder, decoder or scorer class by naming it in an override, e.g.
``model.attention._target_=my_package.MyScorer``. The library classes take plain arguments.
"""

from __future__ import annotations

from collections.abc import Mapping

from hydra.utils import instantiate

from seq2seq.data.vocab import PAD_ID
from seq2seq.models.attention import Attention
from seq2seq.models.seq2seq import Seq2Seq


def build_model(model_cfg: Mapping, *, src_vocab_size: int, tgt_vocab_size: int) -> Seq2Seq:
    """Build the model described by ``model_cfg`` (the ``model`` node of the train config).

    The sizes that depend on each other are passed here rather than repeated in YAML: the
    vocabulary sizes, the scorer's query and key sizes, and the decoder's output size when
    embeddings are tied.
    """
    tie = bool(model_cfg.get("tie_embeddings", False))
    encoder = instantiate(model_cfg["encoder"], vocab_size=src_vocab_size, padding_idx=PAD_ID)
    decoder_cfg = model_cfg["decoder"]
    scorer = instantiate(
        model_cfg["attention"],
        query_dim=decoder_cfg["hidden_size"],
        key_dim=encoder.output_size,
    )
    extra = {"output_dim": decoder_cfg["embed_dim"]} if tie else {}
    decoder = instantiate(
        decoder_cfg,
        vocab_size=tgt_vocab_size,
        attention=Attention(scorer),
        encoder_output_size=encoder.output_size,
        encoder_final_size=encoder.output_size,
        padding_idx=PAD_ID,
        **extra,
    )
    return Seq2Seq(encoder=encoder, decoder=decoder, tie_embeddings=tie)


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
