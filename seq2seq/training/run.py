"""Put a training run together from the composed config: data, model, optimizer, trainer.

This is the composition root of ``train.py``: the only place in training that turns config
nodes into objects (``hydra.utils.instantiate`` for the optimizer and the schedule, and
:func:`~seq2seq.models.build.build_model` for the model, with :func:`~seq2seq.ops.speed_up`'s
kernels). A run with ``trainer.init_from`` starts from a trained model's weights, tokenizers and
model settings (:mod:`seq2seq.training.finetune`).
"""

from __future__ import annotations

import gc
import logging
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from seq2seq.atomic import write_text
from seq2seq.checkpoint import CheckpointError, load_checkpoint, tokenizers_to_payload
from seq2seq.config_types import ConfigError, check_config, config_differences, value_at
from seq2seq.console import FILE_ONLY
from seq2seq.device import set_num_threads
from seq2seq.models.build import build_model, check_model_config, count_parameters, uses_scorer
from seq2seq.models.registry import with_added_model_options
from seq2seq.ops import speed_up
from seq2seq.training import averaging, finetune
from seq2seq.training.distributed import cleanup_distributed, init_distributed
from seq2seq.training.run_folder import NO_RESUME
from seq2seq.training.settings import BatchSettings, TrainerSettings
from seq2seq.training.trainer import Trainer

log = logging.getLogger(__name__)

# Config entries that must match for a checkpoint to be resumed; everything else (learning
# rate, max_steps, validation settings, ...) may change between runs. A fine-tuning run
# continues only from the same parent.
RESUME_MUST_MATCH = ("model", "tokenizer", "data.kind", "data.src_lang", "data.tgt_lang",
                     "data.filter", "parent.sha256")


def check_resume_compatible(checkpoint: dict, config: dict, tokenizers, path: Path) -> None:
    """Stop with a message that says what differs when a checkpoint does not fit this run."""
    differences = []
    for key in RESUME_MUST_MATCH:
        old, new = value_at(checkpoint["config"], key, None), value_at(config, key, None)
        if key == "model" and isinstance(old, dict):  # written before an option was added
            old = with_added_model_options(old)
        differences += [f"{name}: {a!r} -> {b!r}"
                        for name, a, b in config_differences(old, new, key, None)]
    ours = tokenizers_to_payload(tokenizers)
    theirs = checkpoint["tokenizers"]
    if set(ours) != set(theirs) or any(not torch.equal(ours[k], theirs[k]) for k in ours
                                       if k != "joint"):
        differences.append("the sentencepiece vocabulary (data or tokenizer changed)")
    if differences:
        raise CheckpointError(
            f"cannot resume from {path}: the run's config differs in "
            + "; ".join(differences[:10])
            + (f" (and {len(differences) - 10} more)" if len(differences) > 10 else "")
        )


def resolve_resume(resume: str | None, run_dir: Path) -> Path | None:
    if resume in NO_RESUME:
        return None
    if resume == "auto":
        last = run_dir / "checkpoints" / "last.pt"
        if last.is_file():
            return last
        log.info("trainer.resume=auto: no %s yet, starting from scratch", last)
        return None
    path = Path(resume)
    if path.is_dir():
        path = path / "checkpoints" / "last.pt" if (path / "checkpoints").is_dir() else path / "last.pt"
    if not path.is_file():
        raise CheckpointError(f"trainer.resume={resume}: no checkpoint at {path}")
    return path


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def prepare(config: dict, *, is_main: bool, barrier, parent: finetune.Parent | None = None,
            extend_vocab: bool | str = False, freeze: Sequence[str] = ()):
    """Run the data stage; under torchrun rank 0 builds the cache and the others then read it.
    A fine-tuning run encodes with its ``parent``'s tokenizers (extended as ``extend_vocab``
    and ``freeze`` say: :func:`~seq2seq.training.finetune.child_tokenizers`)."""
    from seq2seq.data.corpora import train_corpora_from_config
    from seq2seq.data.prepare import prepare_from_config
    from seq2seq.data.sources import TRAIN_SPLIT, corpus_files_from_config

    def stage():
        tokenizers = None
        if parent is not None:
            corpora = train_corpora_from_config(config["data"])  # None: Multi30k's one pair
            train_files = ([corpus.files for corpus in corpora] if corpora is not None
                           else [corpus_files_from_config(config["data"])[TRAIN_SPLIT]])
            tokenizers = finetune.child_tokenizers(parent, train_files, extend_vocab=extend_vocab,
                                                   freeze=freeze, report=is_main)
        return prepare_from_config(config, tokenizers=tokenizers)

    if is_main:
        prepared = stage()
        barrier()
    else:
        barrier()
        prepared = stage()
    return prepared


def check_train_config(config: dict, overrides: Sequence[str] = (),
                       run_dir: Path | None = None) -> tuple[TrainerSettings, BatchSettings]:
    """Every value of a plain train config checked, before any data is read or file written.

    With ``trainer.init_from``, the model checked is the parent's, once the command line's
    ``overrides`` are found to agree with it; the parent must lie outside ``run_dir`` (None:
    not checked), which a run may empty.

    Raises:
        ConfigError: (a ValueError) naming the key of the first value that cannot work.
    """
    settings = TrainerSettings.from_dict(config["trainer"])
    batch = BatchSettings.from_dict(config["batch"])
    # Every _target_ node against its class's signature.
    check_config({name: node for name, node in config.items() if name != "model"})
    model_cfg = config["model"]
    if settings.init_from is not None:
        parent = finetune.read_parent(settings.init_from, mmap=True)
        model_cfg = finetune.parent_model_config(config, parent, overrides)
        finetune.check_outside_run_folder(parent, run_dir)
    tokenizer = config.get("tokenizer") or {}
    if model_cfg.get("share_all_embeddings") and settings.init_from is None and (
            not tokenizer.get("joint") or tokenizer.get("prune_target_vocabulary", True)):
        raise ConfigError("model.share_all_embeddings=true needs one vocabulary on both sides: "
                          "tokenizer.joint=true and tokenizer.prune_target_vocabulary=false")
    check_model_config(model_cfg, vocab_size=tokenizer.get("vocab_size") or 1000)
    _check_train_corpora(config)
    return settings, batch


def _check_train_corpora(config: dict) -> None:
    """``data.train``'s files, line counts, weights and tags, before a run folder is claimed."""
    from seq2seq.data.corpora import check_train_corpora
    from seq2seq.data.text_files import DataError

    if "data" not in config:
        return
    try:
        check_train_corpora(config["data"], cache_dir=(config.get("paths") or {}).get("cache_dir"))
    except DataError as error:
        raise ConfigError(str(error)) from None


def train(cfg: DictConfig, run_dir: Path, overrides: Sequence[str] = ()) -> dict:
    """Train the model ``cfg`` describes, in ``run_dir``; returns the final numbers.

    ``overrides``: the command line's (a fine-tuning run holds them against its parent's).

    Returns:
        ``best_bleu``, ``best_step``, ``steps``; with ``trainer.average_last`` and an averaged
        model, also ``averaged_bleu`` and ``better_checkpoint`` (``checkpoints/averaged.pt`` or
        ``checkpoints/best.pt``, whichever validated better).
    """
    config = OmegaConf.to_container(cfg, resolve=True)  # the library takes plain containers
    settings, batch = check_train_config(config, overrides, run_dir)
    parent = None
    if settings.init_from is not None:
        parent = finetune.read_parent(settings.init_from)
        config = finetune.adopt_parent(config, parent)
    context = init_distributed(settings.device)
    try:
        if context.device.type == "cpu":
            set_num_threads(settings.num_threads, processes=context.world_size)
        log.info("device %s, %d CPU threads, rank %d of %d", context.device,
                 torch.get_num_threads(), context.rank, context.world_size)
        if parent is not None and context.is_main:
            log.info("fine-tuning from %s (sha256 %s...): its model settings, tokenizers and "
                     "weights; a fresh optimizer and schedule", parent.path,
                     config["parent"]["sha256"][:16])
        prepared = prepare(config, is_main=context.is_main, barrier=context.barrier,
                           parent=parent, extend_vocab=settings.extend_vocab,
                           freeze=settings.freeze)
        if context.is_main:
            log.info("data:\n%s", prepared.format_summary())
        tokenizers = prepared.tokenizers

        seed_everything(settings.seed)
        model = speed_up(build_model(config["model"], src_vocab_size=tokenizers.src.vocab_size,
                                     tgt_vocab_size=tokenizers.tgt.vocab_size)).to(context.device)
        if parent is not None:  # its weights (with rows for added pieces), parts frozen
            finetune.load_parent_weights(model, parent.checkpoint["model"])
            parent = None  # its tensors are not needed any more
            finetune.freeze(model, settings.freeze)
            if settings.freeze and context.is_main:
                log.info("trainer.freeze=[%s]: %s of %s parameters train",
                         ",".join(settings.freeze),
                         f"{count_parameters(model, trainable=True):,}",
                         f"{count_parameters(model):,}")
        parts = ", ".join(f"{name} {type(part).__name__}" for name, part in
                          (("encoder", model.encoder), ("decoder", model.decoder),
                           ("attention", getattr(getattr(model.decoder, "attention", None),
                                                  "scorer", None)))
                          if part is not None)
        total, training = count_parameters(model), count_parameters(model, trainable=True)
        log.info("model: %s parameters%s (%s); the whole model is printed in train.log",
                 f"{total:,}", "" if training == total else f", {training:,} of them trained",
                 parts)
        log.info("model:\n%s", model, extra=FILE_ONLY)
        if config["model"].get("attention") is not None and not uses_scorer(config["model"]["decoder"]):
            log.info("the decoder brings its own attention: the model.attention node "
                     "(model/attention=...) is not used")
        # Frozen parameters (trainer.freeze) stay out of the optimizer: weight decay would
        # move them too.
        optimizer = instantiate(config["optimizer"])(
            [parameter for parameter in model.parameters() if parameter.requires_grad])
        schedule_cfg = dict(config["scheduler"])
        if "total_steps" in schedule_cfg and schedule_cfg["total_steps"] is None:
            schedule_cfg["total_steps"] = settings.max_steps
        schedule = instantiate(schedule_cfg)

        if context.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)

        from seq2seq.data.subword_sampling import sampled_training_pairs
        from seq2seq.data.text_files import read_lines

        valid_src, valid_ref = prepared.raw_files["valid"]
        train_pairs = prepared.splits["train"]
        if settings.train_pairs is not None:
            if prepared.train_mix is not None:
                raise ConfigError("trainer.train_pairs takes the first pairs of one training "
                                  "corpus; data.train holds several")
            train_pairs = train_pairs.first(settings.train_pairs)
        trainer = Trainer(
            model=model,
            optimizer=optimizer,
            schedule=schedule,
            train_data=sampled_training_pairs(
                train_pairs, tokenizers, alpha=settings.subword_sampling, seed=settings.seed,
                max_length=((config.get("data") or {}).get("filter") or {}).get("max_length")),
            valid_data=prepared.splits["valid"],
            valid_sources=read_lines(valid_src),
            valid_references=read_lines(valid_ref),
            tokenizers=tokenizers,
            settings=settings,
            batch=batch,
            run_dir=run_dir,
            config=config,
            context=context,
            train_mix=prepared.train_mix,
        )
        if context.is_main:  # the trainer's config: with the precision it trains in
            write_text(run_dir / "config.yaml", OmegaConf.to_yaml(trainer.config))
        resume_path = resolve_resume(settings.resume, run_dir)
        if resume_path is not None:
            # On the CPU: the random states and tokenizers must stay there; load_state_dict
            # moves the weights and the optimizer's state to the model's device.
            checkpoint = load_checkpoint(resume_path, map_location="cpu")
            check_resume_compatible(checkpoint, config, tokenizers, resume_path)
            trainer.load_training_state(checkpoint)
            log.info("resumed from %s at step %d (epoch %d, batch %d of the epoch)", resume_path,
                     trainer.state.step, trainer.state.epoch + 1, trainer.state.batches_in_epoch)
        state = trainer.fit()
        # DistributedDataParallel is freed while every rank is in the group (a rank freeing it
        # after the other had exited hung in its destructor, 3 runs in 61 of a 2-rank torchrun),
        # and every rank is done before any tears the group down (one was seen to abort then).
        del trainer
        gc.collect()  # the wrapper's reference cycles too
        context.barrier()
        result = {"best_bleu": state.best_bleu, "best_step": state.best_step, "steps": state.step}
        if settings.average_last:  # averaged_bleu, better_checkpoint
            result.update(averaging.summary(state))
        return result
    finally:
        cleanup_distributed()
