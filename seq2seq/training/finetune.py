"""Starting a run from a trained model (``trainer.init_from``): its settings, vocabulary, weights.

A fine-tuning run is a new run (its own folder, a fresh optimizer and schedule, step 0) that
takes from its parent, a checkpoint file or a run folder's ``checkpoints/best.pt``:

- the model settings: the ``model`` node is the parent's; a ``model.*`` value given on the
  command line that contradicts it is refused (:func:`parent_model_config`);
- the tokenizers: the new data is encoded with them, none is trained; the pieces the training
  sentences need and they lack are added (``trainer.extend_vocab``: ``auto`` where nothing is
  frozen, ``true``), or a WARNING says how many sentences then read or write ``<unk>``
  (:mod:`seq2seq.data.vocabulary_coverage`);
- the weights: loaded as they are, plus rows for the added pieces that leave the parent's
  translations unchanged (:func:`load_parent_weights`); ``trainer.freeze`` stops parts from
  training (:func:`freeze`).

Its config records the parent: ``parent: {checkpoint: PATH, sha256: HEX}``.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from seq2seq.checkpoint import (
    CheckpointError,
    check_targets,
    load_checkpoint,
    tokenizers_from_payload,
)
from seq2seq.config_types import ABSENT, ConfigError, config_differences, value_at
from seq2seq.data.hashing import sha256_file
from seq2seq.data.tokenizer import Tokenizers
from seq2seq.data.vocab import EOS_ID
from seq2seq.data.vocabulary_coverage import (
    VocabularyCoverage,
    count_new_pieces,
    extend_tokenizers,
    measure_coverage,
)

log = logging.getLogger(__name__)

# What trainer.init_from=FOLDER starts from: the run's best validated model.
PARENT_IN_RUN_FOLDER = Path("checkpoints") / "best.pt"
# How far below the old pieces' mean logit a new output row starts (trainer.extend_vocab): with
# the lowest old bias alone, the new pieces took about half a percent of the probability at
# each step, and beam search came to prefer shorter translations than the parent's.
NEW_PIECE_MARGIN = 10.0
# At most this many of the added characters are named in the log.
_CHARACTERS_SHOWN = 20


@dataclass
class Parent:
    """The checkpoint a fine-tuning run starts from: the file, resolved, and its content."""

    path: Path
    checkpoint: dict

    @property
    def config(self) -> dict:
        return self.checkpoint["config"]

    def record(self) -> dict:
        """What the child's config keeps of it: the file's path and SHA-256."""
        return {"checkpoint": str(self.path), "sha256": sha256_file(self.path)}


def parent_checkpoint_path(init_from: str) -> Path:
    """The checkpoint ``trainer.init_from`` names: the file itself, or a run folder's
    ``checkpoints/best.pt``.

    Raises:
        ConfigError: when there is no such file.
    """
    path = Path(init_from).expanduser()
    if path.is_dir():
        path = path / PARENT_IN_RUN_FOLDER
    if not path.is_file():
        raise ConfigError(f"trainer.init_from={init_from}: no checkpoint at {path}")
    return path.resolve()


def read_parent(init_from: str, *, mmap: bool = False) -> Parent:
    """Load the parent checkpoint (``mmap``: its tensors mapped, not read, for a check).

    Raises:
        ConfigError: naming ``trainer.init_from``, when the file is missing, unreadable, not a
            trained model's checkpoint, or its config names classes that are not trusted.
    """
    path = parent_checkpoint_path(init_from)
    try:
        checkpoint = load_checkpoint(path, mmap=mmap)
        if not isinstance(checkpoint.get("config"), dict) or "model" not in checkpoint["config"] \
                or "tokenizers" not in checkpoint:
            raise CheckpointError(f"{path} holds no model config or tokenizers")
        check_targets(checkpoint["config"]["model"])
    except CheckpointError as error:
        raise ConfigError(f"trainer.init_from={init_from}: {error}") from None
    return Parent(path=path, checkpoint=checkpoint)


def check_outside_run_folder(parent: Parent, run_dir: Path | None) -> None:
    """Refuse (ConfigError, naming both) a parent inside the run's own folder, which
    trainer.overwrite would empty."""
    if run_dir is None:
        return
    run_dir = Path(run_dir).resolve()
    if run_dir in parent.path.parents:
        raise ConfigError(f"trainer.init_from: the parent {parent.path} lies in this run's folder "
                          f"{run_dir}; a fine-tuning run needs a folder of its own (another "
                          "hydra.run.dir)")


def parent_model_config(config: dict, parent: Parent, overrides: Sequence[str]) -> dict:
    """The parent's ``model`` node, once every ``model.*`` value (or ``model/...`` group) on
    the command line is found to agree with it.

    Raises:
        ConfigError: naming the first override that contradicts the parent, the key and both
            values.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    theirs = parent.config["model"]
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.key_or_group.replace("/", ".")
        if key.split(".")[0] != "model" or override.package:
            continue
        found = config_differences(value_at(config, key), value_at({"model": theirs}, key), key)
        if found:
            key, *values = found[0]
            shown = ["unset" if value is ABSENT else repr(value) for value in values]
            raise ConfigError(
                f"{override.input_line} contradicts the parent's model: {key} is {shown[0]} "
                f"here and {shown[1]} in {parent.path} (trainer.init_from takes the model "
                "settings from the parent: leave the override out)")
    return theirs


def adopt_parent(config: dict, parent: Parent) -> dict:
    """The run's config as a child of ``parent``: its model and tokenizer settings, and
    ``parent`` (path and SHA-256) recorded."""
    child = dict(config)
    child["model"] = copy.deepcopy(parent.config["model"])
    if isinstance(parent.config.get("tokenizer"), dict):
        child["tokenizer"] = copy.deepcopy(parent.config["tokenizer"])
    child["parent"] = parent.record()
    return child


def child_tokenizers(parent: Parent, train_files: Sequence[tuple[Path, Path]], *,
                     extend_vocab: bool | str, freeze: Sequence[str], report: bool) -> Tokenizers:
    """The parent's tokenizers, extended by the pieces the training data needs and they lack
    when ``extend_vocab`` is true, or ``"auto"`` and no part is frozen (``freeze``: the rows of
    the added pieces must train). ``report``: log how much of the data the parent's vocabulary
    writes, as a WARNING when the run goes on without pieces the data needs."""
    tokenizers = tokenizers_from_payload(parent.checkpoint["tokenizers"])
    coverage = measure_coverage(tokenizers, train_files)
    lacking = bool(coverage.src.unknown_sentences or coverage.tgt.unknown_sentences)
    extend = lacking and (extend_vocab is True or (extend_vocab == "auto" and not freeze))
    if report and lacking and not extend:
        log.warning("%s", _unknown_words_warning(coverage, extend_vocab, freeze))
    elif report:
        log.info("%s", coverage.format())
    if not extend:
        return tokenizers
    extended = extend_tokenizers(tokenizers, coverage)
    if report:
        characters = sorted(set(coverage.src.missing_characters)
                            | set(coverage.tgt.missing_characters))
        shown = " ".join(characters[:_CHARACTERS_SHOWN]) + (
            " ..." if len(characters) > _CHARACTERS_SHOWN else "")
        new_src, new_tgt = count_new_pieces(tokenizers, extended)
        log.info("trainer.extend_vocab: %d source and %d target pieces added (characters: %s)%s",
                 new_src, new_tgt, shown or "none",
                 f"; {len(coverage.unkept_target_ids)} pieces of the joint vocabulary newly "
                 "kept on the target side" if coverage.unkept_target_ids else "")
    return extended


def _unknown_words_warning(coverage: VocabularyCoverage, extend_vocab: bool | str,
                           freeze: Sequence[str]) -> str:
    """The share of sentences with pieces the parent lacks, what the model then does with
    their words, and why they are not added."""
    consequences = []
    if coverage.src.unknown_sentences:
        consequences.append("reads <unk> for the source words they spell")
    if coverage.tgt.unknown_sentences:
        consequences.append("writes <unk> in place of the target words they spell")
    if extend_vocab == "auto":
        why = (f"trainer.extend_vocab=auto adds none while trainer.freeze=[{','.join(freeze)}] "
               "is set (their rows could not train): unfreeze to add them")
    else:
        why = "trainer.extend_vocab=auto or true adds them"
    return f"{coverage.format()}: the model {' and '.join(consequences)}; {why}"


def _with_new_rows(old: torch.Tensor, rows: int) -> torch.Tensor:
    """``old`` grown to ``rows`` rows. A new embedding or output row is the mean of the old
    pieces' rows (the special ones left out): a neutral start. A new output bias is the lowest
    old one less :data:`NEW_PIECE_MARGIN`, so a new piece's logit starts at least that far below
    the mean of the old pieces' logits: the probability it takes from them is too small to
    change the parent's translations, and its gradient when it is the target is whole."""
    pieces = old[EOS_ID + 1:] if old.shape[0] > EOS_ID + 1 else old
    fill = pieces.min() - NEW_PIECE_MARGIN if old.dim() == 1 else pieces.mean(dim=0)
    return torch.cat([old, fill.expand(rows - old.shape[0], *old.shape[1:])])


def load_parent_weights(model: nn.Module, state: dict) -> int:
    """Load the parent's ``state`` into ``model``, built for the child's vocabulary: a tensor
    that grew along its first dimension (embeddings, output layer) keeps the parent's rows and
    gets new ones (:func:`_with_new_rows`); returns how many tensors grew.

    Raises:
        CheckpointError: when the weights do not fit the model in any other way.
    """
    own = model.state_dict()
    loaded, grown = {}, 0
    for name, tensor in state.items():
        target = own.get(name)
        if (target is not None and tensor.dim() >= 1 and target.shape[1:] == tensor.shape[1:]
                and target.shape[0] > tensor.shape[0]):
            tensor, grown = _with_new_rows(tensor, target.shape[0]), grown + 1
        loaded[name] = tensor
    try:
        model.load_state_dict(loaded)
    except RuntimeError as error:
        raise CheckpointError(f"the parent's weights do not fit the model: "
                              f"{str(error).splitlines()[0]}") from None
    return grown


def parameters_of(model: nn.Module, part: str) -> list[nn.Parameter]:
    """The parameters of a part of ``trainer.freeze``: ``encoder``; ``decoder`` with the output
    layer; ``embeddings``, every embedding table (source and target, and so a tied output
    layer)."""
    if part == "encoder":
        return list(model.encoder.parameters())
    if part == "decoder":
        return [*model.decoder.parameters(), *model.generator.parameters()]
    if part == "embeddings":
        return [parameter for module in model.modules() if isinstance(module, nn.Embedding)
                for parameter in module.parameters()]
    raise ValueError(f"no part {part!r}")


def freeze(model: nn.Module, parts: Sequence[str]) -> None:
    """Stop the parameters of ``parts`` from training (the optimizer is given only the others)."""
    for part in parts:
        for parameter in parameters_of(model, part):
            parameter.requires_grad_(False)
