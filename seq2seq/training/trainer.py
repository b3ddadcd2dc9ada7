"""The training loop: token batches, mixed precision, validation with sacreBLEU, checkpoints.

One :class:`Trainer` owns one run folder::

    RUN/config.yaml            the resolved config
    RUN/train.log              the log (written by Hydra's logging setup)
    RUN/checkpoints/last.pt    everything needed to resume exactly
    RUN/checkpoints/best.pt    the model with the best validation BLEU (no optimizer state)
    RUN/checkpoints/step*.pt   the best ``keep_best`` models by validation BLEU
    RUN/validation/step*.hyp   detokenized greedy validation translations, one a line
    RUN/tensorboard/           scalars, example translations, attention heatmaps

The loop's order per optimizer step: forward/backward over ``accumulate_grad_batches``
batches -> unscale, clip, check for NaN/inf -> learning rate -> step -> log, validate, save.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from tqdm import tqdm

from seq2seq.checkpoint import save_checkpoint
from seq2seq.data.batching import TokenBucketSampler, collate
from seq2seq.metrics import corpus_scores
from seq2seq.training.distributed import DistributedContext
from seq2seq.training.loss import SequenceLoss
from seq2seq.training.schedulers import Schedule
from seq2seq.training.state import TrainerState, capture_rng_state, restore_rng_state

log = logging.getLogger(__name__)


class TrainingError(Exception):
    """Training cannot go on; the message says why in one line."""


@dataclass
class ValidationSettings:
    max_sentences: int | None = None
    max_tokens: int = 4000
    max_len_a: float = 1.5
    max_len_b: int = 10
    num_examples: int = 3
    attention_plot_index: int = 0


@dataclass
class TrainerSettings:
    """The ``trainer`` config node; see ``configs/trainer/default.yaml`` for each field."""

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
    log_every: int = 100
    valid_every: int | None = 1000
    save_every: int | None = 500
    keep_best: int = 3
    early_stopping_patience: int | None = None
    max_consecutive_nonfinite: int = 5
    resume: str | None = None
    progress_bar: str | bool = "auto"
    valid: ValidationSettings = field(default_factory=ValidationSettings)

    @classmethod
    def from_dict(cls, values: dict) -> TrainerSettings:
        names = {f.name for f in fields(cls)}
        unknown = set(values) - names
        if unknown:
            raise ValueError(f"unknown trainer settings: {sorted(unknown)}")
        values = dict(values)
        values["valid"] = ValidationSettings(**values.get("valid", {}))
        settings = cls(**values)
        if settings.precision not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"trainer.precision must be fp32, bf16 or fp16, not {settings.precision}")
        if settings.accumulate_grad_batches < 1:
            raise ValueError("trainer.accumulate_grad_batches must be >= 1")
        if settings.max_epochs is None and settings.max_steps is None and settings.max_time is None:
            raise ValueError("set at least one of trainer.max_epochs, trainer.max_steps and "
                             "trainer.max_time, or training never ends")
        return settings


@dataclass
class BatchSettings:
    max_tokens: int = 2000
    max_sentences: int | None = None
    bucket_size: int = 100
    num_workers: int = 0


class Trainer:
    """Trains a :class:`Seq2Seq` model; the parts come in as arguments.

    Args:
        model: the model (not yet wrapped for DDP or compiled).
        optimizer: an optimizer over ``model.parameters()``.
        schedule: learning-rate schedule (a factor on each param group's initial lr).
        train_data / valid_data: ``ParallelDataset``s of token ids.
        valid_references: the raw reference lines of the validation set, BLEU is scored on them.
        tokenizers: the run's sentencepiece models (stored in checkpoints; detokenization).
        settings / batch: the ``trainer`` and ``batch`` config nodes.
        run_dir: the run folder.
        config: the resolved run config as plain containers (stored in checkpoints).
        context: rank, world size and device.
    """

    def __init__(
        self,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        schedule: Schedule,
        train_data,
        valid_data,
        valid_references: list[str],
        tokenizers,
        settings: TrainerSettings,
        batch: BatchSettings,
        run_dir: Path,
        config: dict,
        context: DistributedContext,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.schedule = schedule
        self.train_data = train_data
        self.valid_data = valid_data
        self.valid_references = valid_references
        self.tokenizers = tokenizers
        self.settings = settings
        self.batch_settings = batch
        self.run_dir = Path(run_dir)
        self.checkpoint_dir = self.run_dir / "checkpoints"
        self.config = config
        self.context = context
        self.device = context.device
        self.state = TrainerState()
        self._signature_reported = False
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])

        use_cuda = self.device.type == "cuda"
        amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(settings.precision)
        if amp_dtype is not None and self.device.type not in ("cuda", "cpu"):
            log.warning("trainer.precision=%s is not supported on %s; training in fp32",
                        settings.precision, self.device)
            amp_dtype = None
        if amp_dtype is not None and self.device.type == "cpu":
            # The same code path as on GPUs (autocast + grad scaler). bf16 pays off on CPUs
            # with bf16 matrix instructions (AVX512-BF16, AMX): about 2x on the matrix
            # products; elsewhere it can be slower than fp32.
            log.info("trainer.precision=%s on the CPU (autocast)", settings.precision)
        self.amp_dtype = amp_dtype
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=amp_dtype == torch.float16)

        objective: nn.Module = SequenceLoss(model, label_smoothing=settings.label_smoothing)
        if settings.compile:
            objective = torch.compile(objective)
        if context.is_distributed:
            objective = DistributedDataParallel(
                objective, device_ids=[self.device.index] if use_cuda else None
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
        )
        self.loader = DataLoader(
            train_data,
            batch_sampler=self.sampler,
            collate_fn=collate,
            num_workers=batch.num_workers,
            pin_memory=use_cuda,
            # Its own generator: a DataLoader iterator otherwise draws from the global RNG,
            # which would make a resumed run's dropout differ from an uninterrupted one.
            generator=torch.Generator().manual_seed(settings.seed),
        )
        self.writer = None
        if context.is_main:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.run_dir / "tensorboard"))

    # -- checkpoints -------------------------------------------------------------------------
    def checkpoint_payload(self, *, with_training_state: bool = True) -> dict:
        from seq2seq.checkpoint import FORMAT_VERSION, tokenizers_to_payload

        payload = {
            "format_version": FORMAT_VERSION,
            "model": self.model.state_dict(),
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
        return payload

    def save_last(self) -> None:
        if self.context.is_main:
            save_checkpoint(self.checkpoint_payload(), self.checkpoint_dir / "last.pt")

    def load_training_state(self, checkpoint: dict) -> None:
        """Continue from a checkpoint written by :meth:`save_last`."""
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.schedule.load_state_dict(checkpoint["schedule"])
        self.scaler.load_state_dict(checkpoint["scaler"])
        self.state.load_state_dict(checkpoint["trainer_state"])
        self.sampler.load_state_dict(checkpoint["sampler"])
        if self.context.is_main:
            restore_rng_state(checkpoint["rng"])
        else:  # only rank 0's random state is saved; the others get a fresh, distinct one
            torch.manual_seed(self.settings.seed + 1000 * self.context.rank + self.state.step)

    def _keep_best(self, bleu: float) -> None:
        """Save best.pt and the ``keep_best`` best checkpoints; delete the ones that fell out."""
        state = self.state
        if bleu > state.best_bleu:
            state.best_bleu, state.best_step = bleu, state.step
            state.validations_without_improvement = 0
            improved = True
        else:
            state.validations_without_improvement += 1
            improved = False
        if not self.context.is_main:
            return
        payload = None
        if improved:
            payload = self.checkpoint_payload(with_training_state=False)
            save_checkpoint(payload, self.checkpoint_dir / "best.pt")
        if self.settings.keep_best <= 0:
            return
        ranked = sorted(state.best_checkpoints + [[bleu, state.step, None]], key=lambda r: -r[0])
        kept, dropped = ranked[: self.settings.keep_best], ranked[self.settings.keep_best :]
        for entry in kept:
            if entry[2] is None:
                entry[2] = f"step{state.step:07d}-bleu{bleu:.2f}.pt"
                payload = payload or self.checkpoint_payload(with_training_state=False)
                save_checkpoint(payload, self.checkpoint_dir / entry[2])
        for entry in dropped:
            if entry[2] is not None:
                (self.checkpoint_dir / entry[2]).unlink(missing_ok=True)
        state.best_checkpoints = kept

    # -- validation --------------------------------------------------------------------------
    @torch.inference_mode()
    def validate(self) -> dict:
        """Loss, perplexity, and BLEU/chrF of greedy translations of the validation set."""
        from seq2seq.inference.translator import Translator

        model = self.model
        was_training = model.training
        model.eval()
        settings = self.settings.valid
        count = len(self.valid_data)
        if settings.max_sentences:
            count = min(count, settings.max_sentences)
        started = time.perf_counter()

        loss_sum = torch.zeros((), device=self.device)
        tokens = 0
        sampler = TokenBucketSampler(
            src_lengths=self.valid_data.src_lengths[:count],
            tgt_lengths=self.valid_data.tgt_lengths[:count],
            max_tokens=settings.max_tokens,
            shuffle=False,
        )
        objective = SequenceLoss(model)
        for indices in sampler:
            batch = collate([self.valid_data[i] for i in indices], indices).to(self.device)
            with self._autocast():
                _, nll = objective(batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out)
            loss_sum += nll
            tokens += batch.num_tgt_tokens
        loss = loss_sum.item() / max(tokens, 1)

        translator = Translator(
            model,
            self.tokenizers,
            device=self.device,
            beam_size=1,
            max_len_a=settings.max_len_a,
            max_len_b=settings.max_len_b,
            max_tokens=settings.max_tokens,
        )
        sources = [self.valid_data[i][0] for i in range(count)]
        with self._autocast():
            results = translator.translate_ids(sources)
        hypotheses = self.tokenizers.tgt.decode([r[0].tokens for r in results])
        references = self.valid_references[:count]
        scores = corpus_scores(hypotheses, references)
        scores.update(loss=loss, ppl=math.exp(min(loss, 100)),
                      seconds=time.perf_counter() - started)
        if was_training:
            model.train()
        if self.context.is_main:
            self._report_validation(scores, sources, hypotheses, references, translator)
        return scores

    def _report_validation(self, scores, sources, hypotheses, references, translator) -> None:
        step = self.state.step
        out_dir = self.run_dir / "validation"
        out_dir.mkdir(parents=True, exist_ok=True)
        hyp_file = out_dir / f"step{step:07d}.hyp"
        hyp_file.write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
        first_report = not self._signature_reported
        if first_report:  # once per process, so also once after a resume
            log.info("sacreBLEU signature: %s | chrF: %s",
                     scores["bleu_signature"], scores["chrf_signature"])
            self._signature_reported = True
        log.info(
            "validation step %d epoch %d: loss %.3f ppl %.2f BLEU %.2f chrF %.2f (%d sentences, "
            "%.1fs) -> %s",
            step, self.state.epoch + 1, scores["loss"], scores["ppl"], scores["bleu"],
            scores["chrf"], len(hypotheses), scores["seconds"], hyp_file,
        )
        writer = self.writer
        if writer is None:
            return
        for name in ("loss", "ppl", "bleu", "chrf"):
            writer.add_scalar(f"valid/{name}", scores[name], step)
        if first_report:
            writer.add_text("valid/bleu_signature", scores["bleu_signature"], step)
        sources_text = self.tokenizers.src.decode([s.tolist() for s in sources[: self.settings.valid.num_examples]])
        examples = [
            f"**source** {s}  \n**reference** {r}  \n**hypothesis** {h}"
            for s, r, h in zip(sources_text, references, hypotheses, strict=False)
        ]
        if examples:
            writer.add_text("valid/examples", "\n\n---\n\n".join(examples), step)
        index = self.settings.valid.attention_plot_index
        if 0 <= index < len(sources):
            try:
                self._plot_attention(translator, sources[index], step)
            except Exception as error:  # a plot must never stop training
                log.warning("could not draw the attention heatmap: %s", error)
        writer.flush()

    def _plot_attention(self, translator, source_ids, step: int) -> None:
        from seq2seq.inference.attention_plot import plot_attention

        result = translator.translate_ids([source_ids], return_attention=True)[0][0]
        if result.attention is None:
            return
        source_pieces = self.tokenizers.src.pieces(list(source_ids)) + ["</s>"]
        target_pieces = self.tokenizers.tgt.pieces(result.tokens) + ["</s>"]
        weights = result.attention.float().cpu().numpy()[: len(target_pieces), : len(source_pieces)]
        figure = plot_attention(weights, source_pieces, target_pieces, title=f"step {step}")
        self.writer.add_figure("valid/attention", figure, step, close=True)

    # -- training ----------------------------------------------------------------------------
    def _autocast(self):
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def _set_learning_rate(self, step: int) -> None:
        factor = self.schedule.factor(step)
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * factor

    def _broadcast(self, value: float) -> float:
        """Rank 0's ``value`` on every rank, so all ranks take the same decisions."""
        if not self.context.is_distributed:
            return value
        device = self.device if self.device.type == "cuda" else torch.device("cpu")
        tensor = torch.tensor([value], dtype=torch.float64, device=device)
        dist.broadcast(tensor, src=0)
        return float(tensor.item())

    def _time_is_up(self, started: float) -> bool:
        limit = self.settings.max_time
        if limit is None:
            return False
        elapsed = self.state.train_seconds + time.perf_counter() - started
        return bool(self._broadcast(float(elapsed >= limit * 60)))

    def _validate_and_keep(self) -> bool:
        """Validate (on rank 0), keep the best checkpoints; True if training should stop."""
        bleu = self.validate()["bleu"] if self.context.is_main else 0.0
        bleu = self._broadcast(bleu)  # the other ranks wait here while rank 0 validates
        self.schedule.on_validation(bleu)
        self._keep_best(bleu)
        self.last_validated_step = self.state.step
        patience = self.settings.early_stopping_patience
        if patience is not None and self.state.validations_without_improvement >= patience:
            log.info("early stopping: no better validation BLEU in %d validations (best %.2f at "
                     "step %d)", patience, self.state.best_bleu, self.state.best_step)
            return True
        return False

    def _progress_bar(self, total: int | None):
        show = self.settings.progress_bar
        if show == "auto":
            show = sys.stderr.isatty()
        return tqdm(total=total, initial=self.state.step, disable=not (show and self.context.is_main),
                    unit="step", dynamic_ncols=True, file=sys.stderr)

    def fit(self) -> TrainerState:
        """Train until max_steps, max_epochs, max_time or early stopping; return the state."""
        settings, state = self.settings, self.state
        self.model.train()
        self.last_validated_step = -1
        total = settings.max_steps
        if total is None and settings.max_epochs is not None:
            total = settings.max_epochs * len(self.sampler) // settings.accumulate_grad_batches
        progress = self._progress_bar(total)
        started = time.perf_counter()
        window_started = time.perf_counter()
        window_loss = torch.zeros((), device=self.device)
        window_loss_tokens = 0
        accumulated, accumulated_tokens = 0, 0
        stop = False
        log.info("training: %d batches per epoch per rank, %d steps done, epoch %d",
                 len(self.sampler), state.step, state.epoch + 1)
        while not stop:
            if settings.max_epochs is not None and state.epoch >= settings.max_epochs:
                break
            self.sampler.set_epoch(state.epoch, position=state.batches_in_epoch)
            for batch in self.loader:
                batch = batch.to(self.device, non_blocking=True)
                state.batches_in_epoch += 1
                accumulated += 1
                accumulated_tokens += batch.num_tgt_tokens
                sync = accumulated == settings.accumulate_grad_batches
                no_sync = getattr(self.objective, "no_sync", None)
                with (nullcontext() if sync or no_sync is None else no_sync()), self._autocast():
                    loss_sum, nll_sum = self.objective(
                        batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out
                    )
                # Mean over this batch's target tokens (with accumulation: the mean of means).
                self.scaler.scale(loss_sum / batch.num_tgt_tokens / settings.accumulate_grad_batches).backward()
                window_loss += nll_sum.detach()
                window_loss_tokens += batch.num_tgt_tokens
                if not sync:
                    continue
                stop = self._optimizer_step(accumulated_tokens, started)
                accumulated, accumulated_tokens = 0, 0
                progress.update(1)
                if state.step % settings.log_every == 0:
                    self._log_train(window_loss, window_loss_tokens, window_started, progress)
                    window_loss = torch.zeros((), device=self.device)
                    window_loss_tokens, window_started = 0, time.perf_counter()
                if settings.valid_every and state.step % settings.valid_every == 0:
                    state.train_seconds += time.perf_counter() - started
                    stop = self._validate_and_keep() or stop
                    started = time.perf_counter()
                if settings.save_every and state.step % settings.save_every == 0:
                    state.train_seconds += time.perf_counter() - started
                    self.save_last()
                    started = time.perf_counter()
                if settings.max_steps is not None and state.step >= settings.max_steps:
                    stop = True
                stop = stop or self._time_is_up(started)
                if stop:
                    break
            else:
                # The epoch ran out: a partial accumulation still makes a step, then validate.
                if accumulated:
                    stop = self._optimizer_step(accumulated_tokens, started)
                    accumulated, accumulated_tokens = 0, 0
                    progress.update(1)
                state.train_seconds += time.perf_counter() - started
                if self.last_validated_step != state.step:
                    stop = self._validate_and_keep() or stop
                state.epoch += 1
                state.batches_in_epoch = 0
                started = time.perf_counter()
        state.train_seconds += time.perf_counter() - started
        progress.close()
        if self.last_validated_step != state.step:
            self._validate_and_keep()
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
        device = self.device if self.device.type == "cuda" else torch.device("cpu")
        flat = torch.cat([p.detach().reshape(-1).float() for p in self.model.parameters()])
        flat = flat.to(device)
        gathered = [torch.empty_like(flat) for _ in range(self.context.world_size)]
        dist.all_gather(gathered, flat)
        differing = [rank for rank, other in enumerate(gathered) if not torch.equal(other, gathered[0])]
        if differing:
            raise TrainingError(f"ranks {differing} ended with parameters that differ from rank 0")
        log.info("parameters identical on all %d ranks", self.context.world_size)

    def _optimizer_step(self, tokens: int, started: float) -> bool:
        """Clip, skip on NaN/inf, set the lr and step; True if training must stop."""
        settings, state = self.settings, self.state
        self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), settings.grad_clip or float("inf"), error_if_nonfinite=False
        )
        self.last_grad_norm = grad_norm
        if self.scaler.is_enabled():
            # The grad scaler skips non-finite steps itself (and lowers its scale).
            self._set_learning_rate(state.step + 1)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        elif not bool(torch.isfinite(grad_norm)):
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
                    f"stopping. The last good checkpoint is {self.checkpoint_dir / 'last.pt'}. "
                    "Try a lower learning rate, gradient clipping, or fp32."
                )
            return False
        else:
            self._set_learning_rate(state.step + 1)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        state.nonfinite_in_row = 0
        state.step += 1
        state.tokens_seen += tokens
        return False

    def _log_train(self, loss_sum, loss_tokens: int, window_started: float, progress) -> None:
        elapsed = max(time.perf_counter() - window_started, 1e-9)
        tokens_per_second = loss_tokens * self.context.world_size / elapsed
        loss = loss_sum.item() / max(loss_tokens, 1)
        lr = self.optimizer.param_groups[0]["lr"]
        grad_norm = float(self.last_grad_norm)
        progress.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_second:,.0f}")
        if self.writer is not None:
            step = self.state.step
            self.writer.add_scalar("train/loss", loss, step)
            self.writer.add_scalar("train/ppl", math.exp(min(loss, 100)), step)
            self.writer.add_scalar("train/lr", lr, step)
            self.writer.add_scalar("train/grad_norm", grad_norm, step)
            self.writer.add_scalar("train/tokens_per_sec", tokens_per_second, step)
        if progress.disable and self.context.is_main:
            log.info("step %d epoch %d: loss %.3f lr %.2e grad norm %.2f %.0f tok/s",
                     self.state.step, self.state.epoch + 1, loss, lr, grad_norm, tokens_per_second)
