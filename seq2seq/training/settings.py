"""The ``trainer`` and ``batch`` config nodes as typed settings, checked when they are read.

Each field is documented where users see it, in ``seq2seq/configs/trainer/default.yaml`` and
``seq2seq/configs/train.yaml``. A wrong type or an unknown entry is a
:class:`~seq2seq.config_types.ConfigError` naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from seq2seq.config_types import ConfigError, settings_from_dict
from seq2seq.device import PRECISION_OPTIONS
from seq2seq.training.regularization import choices_from_config
from seq2seq.training.run_folder import NO_RESUME

# The parts trainer.freeze takes (seq2seq.training.finetune.parameters_of says what each holds).
FREEZABLE_PARTS = ("encoder", "decoder", "embeddings")


@dataclass
class ValidationSettings:
    max_sentences: int | None = None
    max_tokens: int = 4000
    max_len_a: float = 1.5
    max_len_b: float = 10
    num_examples: int = 3
    attention_plot_index: int = 0


@dataclass
class TrainerSettings:
    seed: int = 1
    device: str = "auto"
    precision: str = "fp32"
    num_threads: int | None = None
    compile: bool = False
    max_epochs: int | None = 20
    max_steps: int | None = None
    max_time: float | None = None
    accumulate_grad_batches: int = 1
    grad_clip: float | None = 1.0
    label_smoothing: float = 0.0
    # sentencepiece's sampling alpha for the training pairs, drawn each epoch (0: stored).
    subword_sampling: float = 0.0
    # Train on the first N training pairs only (a proxy run; None: all of them).
    train_pairs: int | None = None
    log_every: int = 100
    valid_every: int | None = 1000
    valid_each_epoch: bool = True
    save_every: int | None = 500
    keep_best: int = 3
    # Average the models of the last N validations at the end of training (None: do not).
    average_last: int | None = None
    # Validate and keep an exponential moving average of the weights of this decay (None: off).
    ema: float | None = None
    # Dropout and weight decay chosen at the first validation from the epochs the run will
    # reach (seq2seq.training.regularization); empty: model.dropout and optimizer.weight_decay.
    regularization_by_epochs: list = field(default_factory=list)
    # Validations in a row without a better BLEU after which training stops (None: never).
    early_stopping_patience: int | None = None
    max_consecutive_nonfinite: int = 5
    resume: str | None = None
    overwrite: bool = False
    init_from: str | None = None
    # auto: extend where the new data needs it and nothing is frozen (finetune.child_tokenizers).
    extend_vocab: bool | str = "auto"
    freeze: list[str] = field(default_factory=list)
    progress_bar: str | bool = "auto"
    valid: ValidationSettings = field(default_factory=ValidationSettings)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrainerSettings:
        """The ``trainer`` node (plain containers) as settings.

        Raises:
            ConfigError: on an unknown key, a value of the wrong type or out of range.
        """
        settings = settings_from_dict(cls, values, "trainer")
        if settings.precision not in PRECISION_OPTIONS:
            raise ConfigError(f"trainer.precision must be one of {', '.join(PRECISION_OPTIONS)}, "
                              f"not {settings.precision!r}")
        for name in ("accumulate_grad_batches", "log_every", "max_consecutive_nonfinite"):
            if getattr(settings, name) < 1:
                raise ConfigError(f"trainer.{name} must be at least 1, got {getattr(settings, name)}")
        for name in ("max_epochs", "max_steps", "max_time", "valid_every", "save_every",
                     "early_stopping_patience", "num_threads", "train_pairs"):
            value = getattr(settings, name)
            if value is not None and value < 0:
                raise ConfigError(f"trainer.{name} must be positive or null, got {value}")
        if settings.average_last is not None and settings.average_last < 2:
            raise ConfigError(f"trainer.average_last must be at least 2 (or null), "
                              f"got {settings.average_last}")
        if settings.max_epochs is None and settings.max_steps is None and settings.max_time is None:
            raise ConfigError("set at least one of trainer.max_epochs, trainer.max_steps and "
                              "trainer.max_time, or training never ends")
        if settings.ema is not None and not 0 < settings.ema < 1:
            raise ConfigError(f"trainer.ema must be a decay in (0, 1) such as 0.999, or null, "
                              f"got {settings.ema}")
        if not 0 <= settings.label_smoothing < 1:
            raise ConfigError(f"trainer.label_smoothing must be in [0, 1), "
                              f"got {settings.label_smoothing}")
        if not 0 <= settings.subword_sampling <= 1:
            raise ConfigError(f"trainer.subword_sampling must be in [0, 1], "
                              f"got {settings.subword_sampling}")
        settings.regularization_by_epochs = choices_from_config(settings.regularization_by_epochs)
        _check_fine_tuning(settings)
        return settings


def _check_fine_tuning(settings: TrainerSettings) -> None:
    """trainer.init_from, extend_vocab and freeze: each other's prerequisites and conflicts."""
    if not isinstance(settings.freeze, list):
        raise ConfigError(f"trainer.freeze must be a list, e.g. trainer.freeze=[encoder], "
                          f"got {settings.freeze!r}")
    unknown = [part for part in settings.freeze if part not in FREEZABLE_PARTS]
    if unknown:
        raise ConfigError(f"trainer.freeze: unknown part {unknown[0]!r}; the parts are "
                          f"{', '.join(FREEZABLE_PARTS)}")
    if settings.extend_vocab not in (True, False, "auto"):
        raise ConfigError(f"trainer.extend_vocab must be auto, true or false, "
                          f"got {settings.extend_vocab!r}")
    if settings.init_from in NO_RESUME:
        settings.init_from = None
        for name, value in (("extend_vocab", settings.extend_vocab is True),
                            ("freeze", settings.freeze)):
            if value:
                raise ConfigError(f"trainer.{name} applies to fine-tuning only: give "
                                  "trainer.init_from=PATH (a checkpoint or a run folder)")
        return
    if settings.resume not in (*NO_RESUME, "auto"):
        raise ConfigError(f"trainer.init_from starts a new run from a parent's weights and "
                          f"trainer.resume={settings.resume} continues another run: give one of "
                          "them (trainer.resume=auto continues an interrupted fine-tuning run)")
    if settings.extend_vocab is True and settings.freeze:
        raise ConfigError(f"trainer.freeze=[{','.join(settings.freeze)}] with "
                          "trainer.extend_vocab=true: "
                          "the rows of the added pieces could not train; extend without freezing")


@dataclass
class BatchSettings:
    max_tokens: int = 2000
    max_sentences: int | None = None
    bucket_size: int = 100
    num_workers: int = 0

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> BatchSettings:
        settings = settings_from_dict(cls, values, "batch")
        if settings.max_tokens < 1:
            raise ConfigError(f"batch.max_tokens must be positive, got {settings.max_tokens}")
        return settings
