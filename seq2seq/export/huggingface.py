"""Export a Transformer as a Hugging Face ``transformers`` folder (``seq2seq-export
format=huggingface``): ``AutoModelForSeq2SeqLM`` and ``AutoTokenizer`` load it with no code of
ours, and ``generate`` decodes it as our greedy search does.

Our Transformer (:mod:`seq2seq.models.transformer`) is ``transformers``' Pegasus
(``PegasusForConditionalGeneration``) once its model dimension is permuted
(:func:`pegasus_dimensions`: Pegasus lays a position's sines out before its cosines, ours
interleave them), its tables padded to one id space per side, and the decoder started from id
0; the tokenizer is ``MarianTokenizer`` over our sentencepiece model(s). Before it is
published, the folder is loaded back and must reproduce our greedy ids, log-probabilities
(within :data:`LOG_PROB_TOLERANCE`) and tokenization. docs/export.md ("Hugging Face
transformers") gives the folder's files, each bridge in full, and what cannot be equal.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from seq2seq.atomic import write_bytes, write_text
from seq2seq.checkpoint import recorded_languages
from seq2seq.config_types import error_reason
from seq2seq.data.vocab import BOS_ID, EOS_ID, EOS_PIECE, PAD_ID, PAD_PIECE, UNK_ID, UNK_PIECE
from seq2seq.export import ExportError, check_export_options
from seq2seq.export.folder import (
    largest_log_prob_difference,
    random_pairs,
    staged_folder,
    transformer_parts,
)
from seq2seq.export.manifest import build_manifest, write_manifest
from seq2seq.inference.decode_options import DecodeOptions
from seq2seq.inference.export_format import HUGGINGFACE_FORMAT_NAME
from seq2seq.inference.search_loop import Greedy, max_output_lengths, run_search
from seq2seq.models.transformer import sinusoidal_positions

# Rows of Pegasus's position table: the longest source and output the folder can take.
MAX_POSITIONS = 1024
# generate's default output limit (max_new_tokens): ours is per sentence, floor(1.5 n + 10)
# for a source of n pieces, which a batch cannot express; this covers sources up to 164 pieces.
MAX_NEW_TOKENS = 256
# The output bias of target ids the model never outputs (outside a pruned output layer, or past
# the target vocabulary in a table padded to the source's size): exp(NEVER) is 0 in float32.
NEVER = -1e9
# Largest difference of a token's log-probability, transformers against the model (float32).
LOG_PROB_TOLERANCE = 1e-3
# The decoder's start id: Pegasus's convention, which CTranslate2's Pegasus loader assumes.
DECODER_START_ID = PAD_ID
# What our search never outputs (next_token_log_probs bans them).
SUPPRESSED_IDS = [PAD_ID, BOS_ID]
SOURCE_SPM, TARGET_SPM = "source.spm", "target.spm"
SOURCE_VOCAB, TARGET_VOCAB = "vocab.json", "target_vocab.json"
WEIGHTS_NAME = "model.safetensors"
# The gate's length limit: translate.py's default, floor(a * n + b).
LIMIT = DecodeOptions()


def pegasus_dimensions(d_model: int) -> Tensor:
    """Our dimension of each of Pegasus's: its ``[sin 0..d/2, cos 0..d/2]`` from our
    interleaved ``[sin 0, cos 0, sin 1, cos 1, ...]``; ``vector[pegasus_dimensions(d)]`` is the
    same position's vector in Pegasus's layout."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def pegasus_state_dict(model: nn.Module, tokenizers) -> tuple[dict[str, Tensor], int]:
    """``PegasusForConditionalGeneration``'s weights for ``model``, and their ``vocab_size``.

    Raises:
        ExportError: when the model is not a Transformer with one d_model.
    """
    encoder, decoder = transformer_parts(model, "huggingface")
    order = pegasus_dimensions(encoder.output_size)
    vocab_size = max(tokenizers.src.vocab_size, tokenizers.target_model.vocab_size)
    output_ids = torch.as_tensor(tokenizers.target_ids)
    weights: dict[str, Tensor] = {}

    def table(rows: Tensor, ids: Tensor) -> Tensor:  # (len(ids), D) -> (vocab_size, D)
        full = rows.new_zeros(vocab_size, rows.size(1))
        return full.index_copy(0, ids, rows)

    def put_linear(name: str, layer: nn.Linear, *, reads: bool, writes: bool) -> None:
        """A layer that reads (input columns) or writes (output rows) the residual stream."""
        weight, bias = layer.weight, layer.bias
        if reads:
            weight = weight[:, order]
        if writes:
            weight, bias = weight[order], bias[order]
        weights[f"{name}.weight"], weights[f"{name}.bias"] = weight, bias

    def put_norm(name: str, norm: nn.LayerNorm) -> None:
        weights[f"{name}.weight"], weights[f"{name}.bias"] = norm.weight[order], norm.bias[order]

    def put_attention(name: str, attention) -> None:
        # Cross-attention's keys and values read the encoder's stream, permuted alike.
        for ours, theirs in (("query_proj", "q_proj"), ("key_proj", "k_proj"),
                             ("value_proj", "v_proj")):
            put_linear(f"{name}.{theirs}", getattr(attention, ours), reads=True, writes=False)
        put_linear(f"{name}.out_proj", attention.out_proj, reads=False, writes=True)

    def put_feed_forward(name: str, norm: nn.LayerNorm, feed_forward: nn.Sequential) -> None:
        put_norm(f"{name}.final_layer_norm", norm)
        put_linear(f"{name}.fc1", feed_forward[0], reads=True, writes=False)
        put_linear(f"{name}.fc2", feed_forward[-1], reads=False, writes=True)

    # Our own table, not the one Pegasus computes when it is missing (in float64, reported).
    positions = sinusoidal_positions(torch.arange(MAX_POSITIONS), encoder.output_size)[:, order]
    weights["model.encoder.embed_positions.weight"] = positions
    weights["model.decoder.embed_positions.weight"] = positions
    source_table = table(encoder.embedding.weight[:, order],
                         torch.arange(tokenizers.src.vocab_size))
    weights["model.shared.weight"] = source_table  # what get_input_embeddings returns
    weights["model.encoder.embed_tokens.weight"] = source_table
    for number, layer in enumerate(encoder.layers):
        name = f"model.encoder.layers.{number}"
        put_norm(f"{name}.self_attn_layer_norm", layer.self_attention_norm)
        put_attention(f"{name}.self_attn", layer.self_attention)
        put_feed_forward(name, layer.feed_forward_norm, layer.feed_forward)
    put_norm("model.encoder.layer_norm", encoder.final_norm)

    decoder_table = table(decoder.embedding.weight[:, order], output_ids)
    decoder_table[DECODER_START_ID] = decoder_table[BOS_ID]
    weights["model.decoder.embed_tokens.weight"] = decoder_table
    for number, layer in enumerate(decoder.layers):
        name = f"model.decoder.layers.{number}"
        put_norm(f"{name}.self_attn_layer_norm", layer.self_attention_norm)
        put_attention(f"{name}.self_attn", layer.self_attention)
        put_norm(f"{name}.encoder_attn_layer_norm", layer.cross_attention_norm)
        put_attention(f"{name}.encoder_attn", layer.cross_attention)
        put_feed_forward(name, layer.feed_forward_norm, layer.feed_forward)
    put_norm("model.decoder.layer_norm", decoder.final_norm)

    generator = model.generator
    weights["lm_head.weight"] = table(generator.weight[:, order], output_ids)
    bias = torch.full((vocab_size,), NEVER)
    bias[output_ids] = 0.0 if generator.bias is None else generator.bias.float()
    weights["final_logits_bias"] = bias.unsqueeze(0)  # (1, V)
    # safetensors writes each tensor from its own contiguous float32 memory.
    return {name: value.detach().float().contiguous().clone()
            for name, value in weights.items()}, vocab_size


def pegasus_config(model: nn.Module, config: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """The folder's ``config.json``: Pegasus with our sizes and decoding conventions."""
    encoder, decoder = model.encoder, model.decoder
    model_cfg = config.get("model") or {}
    dropout = float(model_cfg.get("dropout", 0.0))
    attention_dropout = float((model_cfg.get("encoder") or {}).get("attention_dropout", 0.0))
    return {
        "architectures": ["PegasusForConditionalGeneration"],
        "model_type": "pegasus",
        "vocab_size": vocab_size,
        "d_model": encoder.output_size,
        "encoder_layers": len(encoder.layers),
        "decoder_layers": len(decoder.layers),
        "encoder_attention_heads": encoder.layers[0].self_attention.num_heads,
        "decoder_attention_heads": decoder.num_heads,
        "encoder_ffn_dim": encoder.layers[0].feed_forward[0].out_features,
        "decoder_ffn_dim": decoder.layers[0].feed_forward[0].out_features,
        "activation_function": "relu",
        # Training's dropout, for fine-tuning in transformers (our FFN dropout follows the ReLU).
        "dropout": dropout, "activation_dropout": dropout, "attention_dropout": attention_dropout,
        "max_position_embeddings": MAX_POSITIONS,
        "scale_embedding": True,
        "pad_token_id": PAD_ID, "bos_token_id": BOS_ID, "eos_token_id": EOS_ID,
        "forced_eos_token_id": EOS_ID, "decoder_start_token_id": DECODER_START_ID,
        "tie_word_embeddings": False,
        "is_encoder_decoder": True,
        "init_std": 0.02,
        # What CTranslate2's ct2-transformers-converter reads (google/pegasus configs carry them).
        "normalize_before": True, "normalize_embedding": False, "static_position_embeddings": True,
        "layer_norm_epsilon": encoder.final_norm.eps,
        "dtype": "float32",
    }


def generation_config() -> dict[str, Any]:
    """The folder's ``generation_config.json``: greedy, with our search's bans and limit rule."""
    return {"decoder_start_token_id": DECODER_START_ID, "bos_token_id": BOS_ID,
            "eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "forced_eos_token_id": EOS_ID,
            "suppress_tokens": SUPPRESSED_IDS, "num_beams": 1, "do_sample": False,
            "max_new_tokens": MAX_NEW_TOKENS}


def _write_vocabulary(path: Path, tokenizer) -> None:
    pieces = {tokenizer.id_to_piece(token_id): token_id for token_id in range(tokenizer.vocab_size)}
    write_text(path, json.dumps(pieces, ensure_ascii=False) + "\n")


def write_tokenizer(folder: Path, tokenizers, config: dict[str, Any]) -> None:
    """``MarianTokenizer``'s files: both sentencepiece models (Marian reads two even when they
    are one), the source vocabulary and, for separate models, the target's."""
    separate = not tokenizers.joint
    _write_vocabulary(folder / SOURCE_VOCAB, tokenizers.src)
    if separate:
        _write_vocabulary(folder / TARGET_VOCAB, tokenizers.target_model)
    else:  # the manifest's writer wrote SOURCE_SPM, and TARGET_SPM for separate models
        write_bytes(folder / TARGET_SPM, tokenizers.target_model.to_bytes())
    src_lang, tgt_lang = recorded_languages(config)
    tokenizer_config = {
        "tokenizer_class": "MarianTokenizer", "source_lang": src_lang, "target_lang": tgt_lang,
        "unk_token": UNK_PIECE, "eos_token": EOS_PIECE, "pad_token": PAD_PIECE,
        "separate_vocabs": separate, "model_max_length": MAX_POSITIONS,
        "clean_up_tokenization_spaces": False,
    }
    write_text(folder / "tokenizer_config.json", json.dumps(tokenizer_config, indent=1) + "\n")


def model_card(config: dict[str, Any], trainer_state: dict[str, Any] | None,
               source: str | None, parameters: int) -> str:
    """The folder's ``README.md``: the Hub's metadata header, then what the model is, how it
    was made and how to run it."""
    data = config.get("data") or {}
    languages = [code for code in recorded_languages(config) if code]
    multi30k = data.get("kind") == "multi30k"
    header = ["---", "library_name: transformers", "pipeline_tag: translation",
              "tags: [translation, seq2seq, pegasus]"]
    if languages:
        header.append(f"language: [{', '.join(languages)}]")
    if multi30k:
        header += ["datasets: [bentrevett/multi30k]", "metrics: [bleu]"]
    header.append("---")
    pair = " → ".join(languages) if len(languages) == 2 else "translation"
    state = trainer_state or {}
    lines = [*header, "", f"# A {pair} Transformer trained with seq2seq", "",
             f"A pre-norm Transformer of {parameters:,} parameters, trained with "
             "seq2seq and exported with "
             "`python export.py format=huggingface`. It loads as "
             "`PegasusForConditionalGeneration` (same architecture, our weights) with a "
             "`MarianTokenizer` over the sentencepiece model(s) it was trained with.", ""]
    if "best_bleu" in state and state["best_bleu"] >= 0:
        lines += [f"- Validation sacreBLEU (greedy, during training): {state['best_bleu']:.2f} "
                  f"at step {state.get('best_step')} of {state.get('step')} "
                  f"({state.get('train_seconds', 0) / 60:.0f} minutes of training)."]
    if multi30k:
        lines += ["- Training data: Multi30k task 1 (Elliott et al., 2016), "
                  f"{data.get('src_lang')}-{data.get('tgt_lang')}."]
    if source:
        lines += [f"- Exported from `{Path(source).name}`."]
    lines += ["", "## Use", "", "```python",
              "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
              'tokenizer = AutoTokenizer.from_pretrained("PATH")',
              'model = AutoModelForSeq2SeqLM.from_pretrained("PATH")',
              'batch = tokenizer(["Ein Hund läuft."], return_tensors="pt", padding=True)',
              "output = model.generate(**batch)  # greedy, as generation_config.json says",
              "print(tokenizer.batch_decode(output, skip_special_tokens=True))", "```", "",
              "Greedy decoding gives the token ids seq2seq's own greedy search gives. Beam search "
              "ranks finished hypotheses by `score / length ** length_penalty`, where seq2seq "
              "uses GNMT's `((5 + length) / 6) ** alpha`; an `<unk>` in the output is dropped by "
              "`skip_special_tokens` where seq2seq writes ` ⁇ `.", "",
              "## How it was made", "", "```json",
              json.dumps({key: config.get(key) for key in ("model", "tokenizer", "optimizer",
                                                            "trainer") if key in config},
                         indent=1), "```", ""]
    return "\n".join(lines)


def _hf_greedy(hf_model, source: list[int], limit: int) -> list[int]:
    """``generate``'s greedy ids for one source (ids with </s>), at most ``limit`` tokens
    before the </s> it then forces; the start id and the final </s> removed."""
    output = hf_model.generate(torch.tensor([source]), max_new_tokens=limit + 1, num_beams=1,
                               do_sample=False)[0].tolist()
    ids = output[1:]
    return ids[:ids.index(EOS_ID)] if EOS_ID in ids else ids


def check_against_model(model: nn.Module, tokenizers, folder: Path) -> float:
    """Load ``folder`` with ``transformers`` and compare it with ``model`` on random sources:
    the greedy ids (each sentence alone, with our length limit), the log-probabilities of
    random targets, and the tokenizer's text. Returns the largest log-probability difference.

    Raises:
        ExportError: when the folder does not load, or differs, naming the first difference.
    """
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one folder of ours: no bar over its 141 tensors
    try:
        hf_model = AutoModelForSeq2SeqLM.from_pretrained(str(folder)).eval()
        hf_tokenizer = AutoTokenizer.from_pretrained(str(folder))
    except Exception as error:  # transformers' own errors
        raise ExportError(f"transformers cannot load the exported folder: "
                          f"{error_reason(error)}") from None
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    sources, targets = random_pairs(tokenizers)
    output_ids = torch.as_tensor(tokenizers.target_ids)
    with torch.no_grad():
        for number, source in enumerate(sources):
            src = torch.tensor([[*source, EOS_ID]])
            lengths = torch.tensor([src.size(1)])
            limit = int(max_output_lengths(lengths, max_len_a=LIMIT.max_len_a,
                                           max_len_b=LIMIT.max_len_b)[0])
            ours = output_ids[run_search(model, src, lengths, Greedy(), max_len_a=LIMIT.max_len_a,
                                         max_len_b=LIMIT.max_len_b)[0][0].tokens].tolist()
            theirs = _hf_greedy(hf_model, src[0].tolist(), limit)
            if ours != theirs:
                raise ExportError(f"transformers' greedy translation of check sentence "
                                  f"{number} differs from ours: {theirs} against {ours}")

    def score(sources, targets):
        log_probs = []
        with torch.no_grad():
            for source, target in zip(sources, targets, strict=True):
                decoder_input = [DECODER_START_ID, *output_ids[target].tolist()]
                logits = hf_model(input_ids=torch.tensor([[*source, EOS_ID]]),
                                  decoder_input_ids=torch.tensor([decoder_input])).logits[0]
                gold = output_ids[torch.tensor([*target, EOS_ID])]
                log_probs.append(logits.float().log_softmax(-1).gather(1, gold.unsqueeze(1))
                                 .squeeze(1).numpy())
        return log_probs

    worst = largest_log_prob_difference(model, tokenizers, score, whose="transformers'",
                                        tolerance=LOG_PROB_TOLERANCE)
    # Text -> ids as ours, corpus tags aside (ours encode a leading tag as one piece, the
    # folder's tokenizer as sentencepiece does: docs/export.md).
    tags = set(tokenizers.src.user_symbols)
    for number, source in enumerate(sources):
        text = tokenizers.src.decode([[token for token in source
                                        if tokenizers.src.id_to_piece(token) not in tags]])[0]
        want = [*tokenizers.src.encode([text])[0], EOS_ID]
        got = hf_tokenizer(text)["input_ids"]
        if got != want:
            raise ExportError(f"the exported tokenizer encodes check sentence {number} "
                              f"{text!r} as {got}, ours as {want}")
    for number, target in enumerate(targets):
        ids = output_ids[target].tolist()
        want = tokenizers.tgt.decode([target])[0]
        got = hf_tokenizer.decode(ids, skip_special_tokens=True)
        if UNK_ID not in target and got != want.strip():
            raise ExportError(f"the exported tokenizer decodes check target {number} as "
                              f"{got!r}, ours as {want!r}")
    return worst


def convert_model(model: nn.Module, tokenizers, config: dict[str, Any], output: str | Path, *,
                  overwrite: bool = False, trainer_state: dict[str, Any] | None = None,
                  source: str | None = None) -> dict[str, Any]:
    """Write ``model`` (a Transformer, on the CPU) as the Hugging Face folder ``output`` and
    check it against the model; returns the manifest written. Arguments as for
    :func:`seq2seq.export.ctranslate2_export.convert_model` (float32 only: no ``quantize``).

    Raises:
        ExportError: when the model is not a Transformer, the folder does not reproduce it, or
            an option is invalid.
        OSError: when the folder cannot be written.
    """
    from safetensors.torch import save

    check_export_options(output, quantize="none", overwrite=overwrite)
    model = model.eval()
    weights, vocab_size = pegasus_state_dict(model, tokenizers)
    started = time.perf_counter()
    with staged_folder(Path(output), overwrite=overwrite) as staging:
        write_bytes(staging / WEIGHTS_NAME, save(weights, metadata={"format": "pt"}))
        write_text(staging / "config.json",
                   json.dumps(pegasus_config(model, config, vocab_size), indent=1) + "\n")
        write_text(staging / "generation_config.json",
                   json.dumps(generation_config(), indent=1) + "\n")
        manifest = build_manifest(staging, model, tokenizers, config,
                                  format_name=HUGGINGFACE_FORMAT_NAME, quantize="none",
                                  trainer_state=trainer_state, source=source,
                                  tokenizer_files=(SOURCE_SPM, TARGET_SPM))
        write_tokenizer(staging, tokenizers, config)
        write_text(staging / "README.md",
                   model_card(config, trainer_state, source, manifest["parameters"]))
        difference = check_against_model(model, tokenizers, staging)
        import transformers

        manifest["export"].update(largest_log_prob_difference=difference,
                                  transformers_version=transformers.__version__)
        write_manifest(staging, manifest, started=started)
    return manifest
