"""The training loop: token batches, gradient accumulation, mixed precision, DDP.

One :class:`Trainer` owns one run folder::

    RUN/config.yaml            the resolved config, with the precision trained in
    RUN/train.log              the log (written by Hydra's logging setup)
    RUN/checkpoints/           see :mod:`seq2seq.training.checkpoint_manager` (with ``trainer.ema``,
                           the validated checkpoints hold the weights' average:
                           :mod:`seq2seq.training.ema`)
    RUN/validation/step*.hyp   detokenized greedy validation translations, one a line
    RUN/tensorboard/           scalars, example translations, attention heatmaps

One optimizer step: forward/backward over a group of ``accumulate_grad_batches`` batches
(fewer at the end of an epoch) -> unscale, clip, check for NaN/inf -> learning rate -> step
-> the weights' average (``trainer.ema``) -> log, validate, save. The loss of a group is
normalised by the group's target tokens (over all ranks), so a step equals the step one batch
holding the whole group would make.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Iterator
from contextlib import nullcontext
from functools import partial
from itertools import islice
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from tqdm import tqdm

from seq2seq.checkpoint import FORMAT_VERSION, TRAINED_PRECISION, tokenizers_to_payload
from seq2seq.console import FILE_ONLY, logs_above_bars
from seq2seq.data.batching import Batch, TokenBucketSampler, collate
from seq2seq.data.mixing import CorpusMix, PairsSeen
from seq2seq.device import AUTOCAST_DTYPES, PRECISION_OPTIONS, choose_precision
from seq2seq.precision import autocast
from seq2seq.training.averaging import average_recent
from seq2seq.training.budget import TrainingBudget, training_over
from seq2seq.training.checkpoint_manager import CheckpointManager
from seq2seq.training.distributed import DistributedContext
from seq2seq.training.ema import WeightAverage
from seq2seq.training.loss import SequenceLoss
from seq2seq.training.regularization import apply_regularization, choose
from seq2seq.training.schedulers import Schedule
from seq2seq.training.settings import BatchSettings, TrainerSettings
from seq2seq.training.state import TrainerState, capture_rng_state, restore_rng_state
from seq2seq.training.step_timing import first_batches, training_workload
from seq2seq.training.validation import Validator

log = logging.getLogger(__name__)


class TrainingError(Exception):
    """Training cannot go on; the message says why in one line."""


class Trainer:
    """Trains a :class:`Seq2Seq` model; the parts come in as arguments.

    ``model`` is not yet wrapped for DDP or compiled; ``schedule`` gives a factor on each param
    group's initial lr; ``train_data`` / ``valid_data`` hold token ids, ``valid_sources`` /
    ``valid_references`` the validation set's raw lines. ``config`` is the resolved run config
    as plain containers; :attr:`config`, stored in checkpoints, adds ``trained_precision``, the
    precision the run trains in. ``train_mix`` gives the training corpora and their weights when
    ``train_data`` holds several (batches then draw from them by weight, and the log gives each
    one's share).
    """

    def __init__(
        self,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        schedule: Schedule,
        train_data,
        valid_data,
        valid_sources: list[str],
        valid_references: list[str],
        tokenizers,
        settings: TrainerSettings,
        batch: BatchSettings,
        run_dir: Path,
        config: dict,
        context: DistributedContext,
        train_mix: CorpusMix | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.schedule = schedule
        self.tokenizers = tokenizers
        self.train_data = train_data
        self.settings = settings
        self.run_dir = Path(run_dir)
        self.context = context
        self.device = context.device
        self.state = TrainerState()
        self.last_grad_norm = torch.zeros(())
        # trainer.ema: the weights' average is what is validated and kept.
        self.ema = WeightAverage(model, settings.ema) if settings.ema is not None else None
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])

        loss = SequenceLoss(model, label_smoothing=settings.label_smoothing)
        precision = settings.precision
        if context.is_main:  # auto measures on rank 0 alone, and every rank takes its choice
            workload = None
            if precision == "auto" and self.device.type == "cpu":  # its own step and batches
                workload = training_workload(
                    loss, optimizer, partial(first_batches, train_data,
                                             max_tokens=batch.max_tokens,
                                             max_sentences=batch.max_sentences,
                                             bucket_size=batch.bucket_size, seed=settings.seed),
                    device=self.device, max_tokens=batch.max_tokens)
            precision = choose_precision(precision, self.device, log=log,
                                         option="trainer.precision", workload=workload)
        if context.is_distributed:
            precision = PRECISION_OPTIONS[int(context.broadcast(PRECISION_OPTIONS.index(precision)))]
        self.amp_dtype = amp_dtype = AUTOCAST_DTYPES[precision]
        if amp_dtype is not None and self.device.type not in ("cuda", "cpu"):
            log.warning("trainer.precision=%s is not supported on %s; training in fp32",
                        precision, self.device)
            self.amp_dtype = amp_dtype = None
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=amp_dtype == torch.float16)
        # What trains, beside what was asked (trainer.precision may say auto, and auto may
        # choose differently on another machine): compare.py groups runs by it.
        self.precision = precision if amp_dtype is not None else "fp32"
        self.config = {**config, TRAINED_PRECISION: self.precision}

        objective: nn.Module = loss
        if settings.compile:
            # The criterion stays eager (the loss kernel loops over a batch's rows); wrapped
            # here, not where it is defined, so that importing it leaves torch._dynamo unloaded.
            loss.criterion = torch.compiler.disable(loss.criterion)
            objective = torch.compile(objective)
        if context.is_distributed:
            objective = DistributedDataParallel(
                objective, device_ids=[self.device.index] if self.device.type == "cuda" else None
            )
        self.objective = objective

        self.sampler = TokenBucketSampler(
            src_lengths=train_data.src_lengths,
            tgt_lengths=train_data.tgt_lengths,
            max_tokens=batch.max_tokens,
            max_sentences=batch.max_sentences,
            bucket_size=batch.bucket_size,
            shuffle=True,
            seed=settings.seed,
            rank=context.rank,
            world_size=context.world_size,
            mix=train_mix,
        )
        self.pairs_seen = (PairsSeen(train_mix)
                           if train_mix is not None and len(train_mix) > 1 else None)
        # The progress bar follows the budget's share spent when a time limit is set (the
        # presets): the steps such a run will make are not known.
        self.bar_follows_budget = settings.max_time is not None
        self.budget = TrainingBudget(
            max_steps=settings.max_steps, max_epochs=settings.max_epochs,
            max_time=settings.max_time, batches_per_epoch=len(self.sampler),
            broadcast=context.broadcast)
        self.loader = DataLoader(
            train_data,
            batch_sampler=self.sampler,
            collate_fn=collate,
            num_workers=batch.num_workers,
            pin_memory=self.device.type == "cuda",
            # Workers that live across epochs: a preset whose epochs take seconds (a GPU's)
            # would otherwise start them anew each epoch. Pairs drawn anew each epoch
            # (trainer.subword_sampling) need new workers, which fork with the new draw.
            persistent_workers=batch.num_workers > 0 and train_data.same_each_epoch,
            # Its own generator: a DataLoader iterator otherwise draws from the global RNG,
            # which would make a resumed run's dropout differ from an uninterrupted one.
            generator=torch.Generator().manual_seed(settings.seed),
        )
        self.writer = None
        if context.is_main:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.run_dir / "tensorboard"))
        self.checkpoints = CheckpointManager(
            directory=self.run_dir / "checkpoints", keep_best=settings.keep_best,
            average_last=settings.average_last, enabled=context.is_main)
        self.validator = Validator(
            data=valid_data, sources=valid_sources, references=valid_references,
            tokenizers=tokenizers, settings=settings.valid,
            precision=self.precision,
            output_dir=self.run_dir / "validation" if context.is_main else None,
            writer=self.writer,
        )

    # -- checkpoints -------------------------------------------------------------------------
    @property
    def validated_model(self) -> nn.Module:
        """What validation scores and the kept checkpoints hold: the weights' average with
        ``trainer.ema``, else the model being trained."""
        return self.model if self.ema is None else self.ema.model

    def checkpoint_payload(self, *, with_training_state: bool = True) -> dict:
        """last.pt's payload (the model being trained, and all it needs to resume), or with
        ``with_training_state=False`` a kept checkpoint's (the validated model)."""
        payload = {
            "format_version": FORMAT_VERSION,
            "model": (self.model if with_training_state else self.validated_model).state_dict(),
            "config": self.config,
            "tokenizers": tokenizers_to_payload(self.tokenizers),
            "trainer_state": self.state.state_dict(),
            "torch_version": str(torch.__version__),
        }
        if with_training_state:
            payload.update(
                optimizer=self.optimizer.state_dict(),
                schedule=self.schedule.state_dict(),
                scaler=self.scaler.state_dict(),
                sampler=self.sampler.state_dict(batches_consumed=self.state.batches_in_epoch),
                rng=capture_rng_state(),
            )
            if self.ema is not None:
                payload["ema"] = self.ema.state_dict()
        return payload

    def save_last(self) -> None:
        # Every rank comes here: the pairs seen are summed over ranks first (rank 0 resumes
        # with the sum, the others from zero).
        seen = self._pairs_seen_over_ranks()
        if self.context.is_main:
            payload = self.checkpoint_payload()
            if seen is not None:
                payload["corpus_pairs_seen"] = seen.tolist()
            self.checkpoints.save_last(payload)

    def _pairs_seen_over_ranks(self) -> np.ndarray | None:
        if self.pairs_seen is None:
            return None
        return np.array([self.context.sum(int(count)) for count in self.pairs_seen.counts])

    def load_training_state(self, checkpoint: dict) -> None:
        """Continue from a checkpoint written by :meth:`save_last`."""
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.schedule.load_state_dict(checkpoint["schedule"])
        self.scaler.load_state_dict(checkpoint["scaler"])
        self.state.load_state_dict(checkpoint["trainer_state"])
        if self.state.regularization is not None:  # the choice the run made goes on
            apply_regularization(self.model, self.optimizer,
                                 dropout=self.state.regularization["dropout"],
                                 weight_decay=self.state.regularization["weight_decay"])
        self.sampler.load_state_dict(checkpoint["sampler"])
        saved = checkpoint.get("ema")
        if self.ema is not None and saved is not None:
            if saved.get("decay") != self.ema.decay:
                log.info("trainer.ema=%g: the checkpoint's average was made with decay %s; it "
                         "goes on with %g", self.ema.decay, saved.get("decay"), self.ema.decay)
            self.ema.load_state_dict(saved)
        elif self.ema is not None:  # a run resumed with trainer.ema newly set
            self.ema = WeightAverage(self.model, self.ema.decay)
            log.info("trainer.ema: the checkpoint has no average of the weights; it starts "
                     "from the resumed weights")
        elif saved is not None:
            log.warning("the checkpoint has an average of the weights (trainer.ema=%s), which "
                        "this run without trainer.ema drops: it validates and keeps the trained "
                        "weights", saved.get("decay"))
        seen = checkpoint.get("corpus_pairs_seen")
        if (self.pairs_seen is not None and self.context.is_main and seen is not None
                and len(seen) == len(self.pairs_seen.counts)):
            self.pairs_seen.counts[:] = seen
        if self.context.is_main:
            restore_rng_state(checkpoint["rng"])
        else:  # only rank 0's random state is saved; the others get a fresh, distinct one
            torch.manual_seed(self.settings.seed + 1000 * self.context.rank + self.state.step)

    # -- helpers -----------------------------------------------------------------------------
    def _validate_and_keep(self) -> bool:
        """Validate (on rank 0), keep the best checkpoints; True if training should stop."""
        state = self.state
        bleu = 0.0
        if self.context.is_main:
            scores = self.validator(self.validated_model, device=self.device, step=state.step,
                                    epoch=state.epoch + 1, minutes=state.train_seconds / 60)
            bleu = scores["bleu"]
        bleu = self.context.broadcast(bleu)  # the other ranks wait here while rank 0 validates
        self.schedule.on_validation(bleu)
        self.checkpoints.record_validation(
            state, bleu, lambda: self.checkpoint_payload(with_training_state=False))
        state.last_validated_step = state.step
        if self.settings.regularization_by_epochs and state.regularization is None:
            self._choose_regularization()
        patience = self.settings.early_stopping_patience
        if patience is not None and state.validations_without_improvement >= patience:
            log.info("early stopping: no better validation BLEU in %d validations (best %.2f at "
                     "step %d)", patience, state.best_bleu, state.best_step)
            return True
        return False

    def _choose_regularization(self) -> None:
        """trainer.regularization_by_epochs, at the first validation: the entry for the epochs
        the budget will reach at the pace so far (the same on every rank: rank 0's clock)."""
        state = self.state
        epochs = self.budget.epochs_at_end(state)
        if epochs is None:
            return
        choice = choose(self.settings.regularization_by_epochs, epochs)
        dropout = None if choice is None else choice.dropout
        weight_decay = None if choice is None else choice.weight_decay
        apply_regularization(self.model, self.optimizer, dropout=dropout,
                             weight_decay=weight_decay)
        state.regularization = {"step": state.step, "epochs": epochs, "dropout": dropout,
                                "weight_decay": weight_decay}
        if choice is None:
            log.info("trainer.regularization_by_epochs: the budget will reach %.1f epochs at "
                     "this pace (step %d): no entry's below_epochs is above that, "
                     "model.dropout and optimizer.weight_decay stay as set", epochs, state.step)
            return
        log.info("trainer.regularization_by_epochs: the budget will reach %.1f epochs at this "
                 "pace (step %d), below %g: dropout %s and weight decay %s from here on",
                 epochs, state.step, choice.below_epochs,
                 "as set" if dropout is None else f"{dropout:g}",
                 "as set" if weight_decay is None else f"{weight_decay:g}")

    def _progress_bar(self, total_steps: int | None):
        """With ``max_time`` set, a bar over the share of the budget spent (whichever limit ends
        first: time, steps or epochs), with the ETA; else a bar over the steps. On rank 0 only,
        on a terminal unless trainer.progress_bar says otherwise."""
        show = self.settings.progress_bar
        show = (sys.stderr.isatty() if show == "auto" else show) and self.context.is_main
        if self.bar_follows_budget:
            return tqdm(total=100, initial=100 * (self.budget.progress(self.state) or 0),
                        disable=not show, dynamic_ncols=True, file=sys.stderr,
                        bar_format="{l_bar}{bar}| {n:.0f}% of the budget "
                                   "[{elapsed}<{remaining}{postfix}]")
        return tqdm(total=total_steps, initial=self.state.step, disable=not show, unit="step",
                    dynamic_ncols=True, file=sys.stderr)

    def _advance(self, progress) -> None:
        """One step done: a step bar moves by one, a budget bar to the share spent."""
        if not self.bar_follows_budget:
            progress.update(1)
            return
        spent = min(100 * (self.budget.progress(self.state) or 0), 100)
        progress.update(max(spent - progress.n, 0))

    # -- training ----------------------------------------------------------------------------
    def _groups(self) -> Iterator[list[Batch]]:
        """The rest of this epoch's batches, in groups of ``accumulate_grad_batches``."""
        batches = iter(self.loader)
        while group := list(islice(batches, self.settings.accumulate_grad_batches)):
            if self.pairs_seen is not None:  # counted on the CPU, before the move
                for batch in group:
                    self.pairs_seen.add(batch.indices)
            yield [batch.to(self.device, non_blocking=True) for batch in group]

    def _accumulate(self, group: list[Batch]) -> tuple[torch.Tensor, int]:
        """Forward and backward over one group; returns its summed NLL and its target tokens.

        Every rank runs as many groups of the same sizes (the sampler gives each rank the same
        number of batches), and only the group's last backward synchronises gradients under
        DDP, so every optimizer step sees gradients summed over all ranks and batches.
        """
        tokens = sum(batch.num_tgt_tokens for batch in group)
        # DDP averages gradients over ranks; scaling by world_size / all tokens makes the
        # result the gradient of the summed loss over every token of the step, divided by
        # their number: what one batch holding them all would give.
        scale = self.context.world_size / max(self.context.sum(tokens), 1)
        no_sync = getattr(self.objective, "no_sync", None)
        nll_total = torch.zeros((), device=self.device)
        for position, batch in enumerate(group):
            last = position == len(group) - 1
            with (nullcontext() if last or no_sync is None else no_sync(),
                  autocast(self.device.type, self.amp_dtype)):
                loss_sum, nll_sum = self.objective(
                    batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out
                )
            self.scaler.scale(loss_sum * scale).backward()
            nll_total += nll_sum.detach()
        return nll_total, tokens

    def fit(self) -> TrainerState:
        """Train until max_steps, max_epochs, max_time or early stopping; return the state."""
        settings = self.settings
        self.model.train()
        total = settings.max_steps
        if total is None and settings.max_epochs is not None:
            groups = math.ceil(len(self.sampler) / settings.accumulate_grad_batches)
            total = settings.max_epochs * groups
        progress = self._progress_bar(total)
        with logs_above_bars(not progress.disable):
            return self._fit(progress)

    def _fit(self, progress) -> TrainerState:
        settings, state = self.settings, self.state
        self.budget.start(state)  # a resumed run goes on from the seconds it had trained
        started = window_started = time.perf_counter()
        window_loss = torch.zeros((), device=self.device)
        window_tokens = 0
        stop = False
        log.info("training: %d batches per epoch per rank, %d steps done, epoch %d",
                 len(self.sampler), state.step, state.epoch + 1)
        while not stop:
            if training_over(state, settings, self.budget.seconds_trained):
                break  # the last epoch ended, or a resumed run had already finished
            self.train_data.set_epoch(state.epoch)  # a new segmentation, with subword sampling
            self.sampler.set_lengths(self.train_data.src_lengths, self.train_data.tgt_lengths)
            self.sampler.set_epoch(state.epoch, position=state.batches_in_epoch)
            for group in self._groups():
                nll_sum, tokens = self._accumulate(group)
                state.batches_in_epoch += len(group)
                window_loss += nll_sum
                window_tokens += tokens
                if not self._optimizer_step(tokens):
                    # A skipped update (NaN/inf) moves no step: nothing to log, validate or save.
                    if self.budget.time_is_up(state, started):
                        stop = True
                        break
                    continue
                self._advance(progress)
                if state.step % settings.log_every == 0:
                    self._log_train(window_loss, window_tokens, window_started, progress)
                    window_loss = torch.zeros((), device=self.device)
                    window_tokens, window_started = 0, time.perf_counter()
                if settings.valid_every and state.step % settings.valid_every == 0:
                    state.train_seconds += time.perf_counter() - started
                    stop = self._validate_and_keep()
                    started = time.perf_counter()
                if settings.save_every and state.step % settings.save_every == 0:
                    state.train_seconds += time.perf_counter() - started
                    self.save_last()
                    started = time.perf_counter()
                at_max_steps = settings.max_steps is not None and state.step >= settings.max_steps
                stop = stop or at_max_steps or self.budget.time_is_up(state, started)
                if stop:
                    break
            else:  # the epoch ran out: validate (unless valid_each_epoch=false), then the next
                state.train_seconds += time.perf_counter() - started
                if settings.valid_each_epoch and state.last_validated_step != state.step:
                    stop = self._validate_and_keep()
                state.epoch += 1
                state.batches_in_epoch = 0
                started = time.perf_counter()
        state.train_seconds += time.perf_counter() - started
        progress.close()
        if state.last_validated_step != state.step:
            self._validate_and_keep()
        # trainer.average_last: checkpoints/averaged.pt, validated
        average_recent(state, self.checkpoints, model=self.validated_model,
                       validator=self.validator,
                       context=self.context, writer=self.writer)
        self.save_last()
        if self.context.is_distributed:
            self._check_ranks_in_sync()
        if self.writer is not None:
            self.writer.close()
        log.info("done: %d steps, %d epochs started, %.1f min training, best BLEU %.2f at step %d",
                 state.step, state.epoch + 1, state.train_seconds / 60, state.best_bleu,
                 state.best_step)
        return state

    def _check_ranks_in_sync(self) -> None:
        """All ranks must end with the same parameters; a difference means a DDP bug."""
        differing = self.context.ranks_differing(self.model.parameters())
        if differing:
            raise TrainingError(f"ranks {differing} ended with parameters that differ from rank 0")
        log.info("parameters identical on all %d ranks", self.context.world_size)

    def _optimizer_step(self, tokens: int) -> bool:
        """Clip, set the lr and step; skip the update on a NaN/inf gradient. Returns whether
        the update was made (the same on every rank: the gradients it judges were all-reduced).

        Raises:
            TrainingError: after ``max_consecutive_nonfinite`` skipped updates in a row.
        """
        settings, state = self.settings, self.state
        self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), settings.grad_clip or float("inf"), error_if_nonfinite=False
        )
        self.last_grad_norm = grad_norm
        if not self.scaler.is_enabled() and not bool(torch.isfinite(grad_norm)):
            # (With fp16 the grad scaler skips non-finite steps itself and lowers its scale.)
            self.optimizer.zero_grad(set_to_none=True)
            state.nonfinite_in_row += 1
            state.nonfinite_total += 1
            log.warning("non-finite loss or gradient at step %d: update skipped (%d in a row, %d "
                        "in total)", state.step + 1, state.nonfinite_in_row, state.nonfinite_total)
            if self.writer is not None:
                self.writer.add_scalar("train/nonfinite_steps", state.nonfinite_total, state.step)
            if state.nonfinite_in_row >= settings.max_consecutive_nonfinite:
                raise TrainingError(
                    f"{state.nonfinite_in_row} non-finite losses in a row at step {state.step + 1}; "
                    f"stopping. The last good checkpoint is {self.checkpoints.last_path}. "
                    "Try a lower learning rate, gradient clipping, or fp32."
                )
            return False
        factor = self.schedule.factor(state.step + 1, progress=self.budget.progress(state))
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * factor
        self.scaler.step(self.optimizer)  # a plain optimizer.step() when the scaler is off
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update(self.model)
        state.nonfinite_in_row = 0
        state.step += 1
        state.tokens_seen += tokens
        return True

    def _log_train(self, loss_sum, loss_tokens: int, window_started: float, progress) -> None:
        elapsed = max(time.perf_counter() - window_started, 1e-9)
        tokens_per_second = loss_tokens * self.context.world_size / elapsed
        loss = loss_sum.item() / max(loss_tokens, 1)
        lr = self.optimizer.param_groups[0]["lr"]
        grad_norm = float(self.last_grad_norm)
        postfix = {}
        if self.bar_follows_budget:
            postfix = {"step": self.state.step,
                       "min": f"{self.budget.seconds_trained / 60:.1f}/{self.settings.max_time:g}"}
        progress.set_postfix(**postfix, loss=f"{loss:.3f}", lr=f"{lr:.2e}",
                             tok_s=f"{tokens_per_second:,.0f}")
        seen = self._pairs_seen_over_ranks()  # every rank: a sum over ranks
        corpora = "" if seen is None else f"; corpora: {self.pairs_seen.describe(seen)}"
        if self.writer is not None:
            step = self.state.step
            for name, value in (("loss", loss), ("ppl", math.exp(min(loss, 100))), ("lr", lr),
                                ("grad_norm", grad_norm), ("tokens_per_sec", tokens_per_second)):
                self.writer.add_scalar(f"train/{name}", value, step)
            if seen is not None:
                for name, count in zip(self.pairs_seen.mix.names, seen, strict=True):
                    self.writer.add_scalar(f"train/corpus_share/{name}",
                                           count / max(seen.sum(), 1), step)
        if self.context.is_main:  # a visible bar shows them on the terminal already
            log.info("step %d epoch %d: loss %.3f lr %.2e grad norm %.2f %.0f tok/s%s",
                     self.state.step, self.state.epoch + 1, loss, lr, grad_norm, tokens_per_second,
                     corpora, extra=None if progress.disable else FILE_ONLY)
