"""The training loop: microbatches with gradient accumulation, clipping, evaluation, logging and checkpoints.

The trainer knows models only through the ``CausalLM`` protocol (llmfoundry.models.interface: forward returns
logits; ``supports_sequence_id``, ``get_input_embeddings``, ``blocks``, ``flops_per_token``); parallelism,
precision and checkpointing are applied here, from outside the model. The loss is llmfoundry.models.loss's,
summed per microbatch and divided by the target tokens of the whole global batch.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import torch
from tqdm.auto import tqdm

from llmfoundry import registry
from llmfoundry.core.secrets import mask_secrets
from llmfoundry.core import dist, precision
from llmfoundry.core.errors import ConfigError
from llmfoundry.core.notices import notice_once
from llmfoundry.core.timeunits import Time, estimated_last_batch, interval_due
from llmfoundry.data.prep.quickstart import prepare
from llmfoundry.data.text import check_token_ids
from llmfoundry.eval.loaders import evaluate_loader, model_inputs
from llmfoundry.eval.sections import eval_sections
from llmfoundry.models.interface import label_offset
from llmfoundry.models.loss import TokenLoss, aux_loss_sum
from llmfoundry.models.metrics import LanguageMetrics, eval_metric_names, train_metric_names
from llmfoundry.train import (checkpoint, checkpointer, compat, composer_checkpoint, host_sums, parallel, preemption,
                              step_metrics)
from llmfoundry.train.builders import (
    build_dataloader,
    build_model,
    build_named,
    build_optimizer,
    build_schedule,
    build_tokenizer,
)
from llmfoundry.train.callbacks.torch_profiler import TorchProfiler
from llmfoundry.train.components import Component, training_components
from llmfoundry.train.errors import TrainingStopped
from llmfoundry.train.icl import TrainingICL, icl_subset
from llmfoundry.train.intervals import loader_length, run_intervals
from llmfoundry.train.only_checkpoint import write_only_checkpoint
from llmfoundry.train.recipe import TrainConfig, to_plain
from llmfoundry.train.run_name import resolve_run_name
from llmfoundry.train.state import EvalHistory, TrainState, TrainTime

log = logging.getLogger(__name__)


class Trainer:
    def __init__(self, cfg: TrainConfig, config_plain: dict[str, Any] | None = None):
        self.cfg = cfg
        # What is logged and saved next to checkpoints: never with tokens, keys or passwords in it.
        self.config_plain = mask_secrets(config_plain if config_plain is not None else to_plain(cfg))
        # what loggers receive: metadata's keys at the top level unless flatten_metadata is false
        self.logged_config = compat.logged_config(self.config_plain, cfg.flatten_metadata)
        self.dist = dist.init_distributed(cfg.dist_timeout)
        self.device = self.dist.device
        cfg.precision, note = precision.supported_precision(cfg.precision, self.device)  # amp_bf16 needs a bf16 GPU
        if note:
            notice_once(note)
        # the recipe's run_name, $RUN_NAME or a generated one; {run_name} is expanded in save_folder, load_path, ...
        self.run_name, cfg = resolve_run_name(cfg, dist.broadcast_object)
        self.cfg = cfg
        self.time = TrainTime()
        self.history = EvalHistory()
        torch.manual_seed(cfg.seed)

        if cfg.prepare_data is not None:
            self._prepare_data()
        self.tokenizer = build_tokenizer(cfg.tokenizer, cfg.max_seq_len)
        world = self.dist.world_size
        # the ranks of a tensor-parallel group train on the same batches: data is dealt by data-parallel rank
        self.tp = cfg.tp_config if cfg.tp_config is not None and cfg.tp_config.tensor_parallel_degree > 1 else None
        self.data_share = dist.data_share(self.tp.tensor_parallel_degree if self.tp else 1)
        self.device_batch_size = compat.device_batch_size(cfg.global_train_batch_size, world, self.tp)
        compat.check_derived_batch_keys(cfg, world, self.device_batch_size)
        compat.log_notices(cfg)
        micro = cfg.device_train_microbatch_size
        # auto: the whole device batch, halved on a CUDA out-of-memory error (see train_step)
        self.auto_microbatch = micro == "auto"
        self.microbatch_size = self.device_batch_size if micro == "auto" else micro

        model = build_model(cfg.model, self.tokenizer)
        if parallel.is_meta(model):  # materialised after sharding, on this rank's device
            self.model = model.to(precision.weight_dtype(cfg.precision))
        else:
            self.model = model.to(self.device, precision.weight_dtype(cfg.precision))
        self.parallel_model = parallel.parallelize(
            self.model, fsdp=cfg.fsdp_config, compile_cfg=cfg.compile_config, precision=cfg.precision,
            device=self.device, world_size=world, seed=cfg.seed, tp=self.tp)
        # every token id of a batch must be below it (check_token_ids: a data/model mismatch, not an IndexError)
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        self.loss = TokenLoss(label_offset(self.model))  # offset 0: an encoder-decoder model's labels are not shifted
        self.optimizer = build_optimizer(cfg.optimizer, self.model)
        self.scaler = precision.grad_scaler(cfg.precision, self.device)
        self.algorithms = build_named(registry.algorithms, cfg.algorithms)
        self.callbacks = build_named(registry.callbacks, cfg.callbacks)
        if cfg.profiler is not None:
            self.callbacks.append(TorchProfiler(cfg.profiler, self.run_name))
        self.loggers = build_named(registry.loggers, cfg.loggers, self.run_name) if self.dist.is_main else []
        self.metrics_log = step_metrics.MetricsLog(  # batches' metrics until the next log interval
            self.loggers, lambda values, step: self.state.print(step_metrics.console_line(values, step, self.max_batches))
            if cfg.log_to_console else None)
        self.checkpointer = checkpointer.Checkpointer(cfg.save_folder, cfg.checkpoint_upload,
                                                    keep=cfg.save_num_checkpoints_to_keep,
                                                    overwrite=cfg.save_overwrite, save_async=cfg.save_async)
        host_sums.host_group()  # every rank together: the gloo group of host sums (token counts, preemption votes)
        self.preemption = preemption.Preemption(  # stop cleanly when asked to
            cfg.preemption_signal, cfg.preemption_check_interval, cfg.exit_before_walltime)

        self.train_loader = build_dataloader(cfg.train_loader, self.tokenizer, self.device_batch_size, "train_loader",
                                         self.data_share)
        # (metric prefix, loader): eval_loader's metrics/eval/..., or each of eval_loaders' metrics/eval/<label>/...
        self.eval_loaders = [(prefix, build_dataloader(section, self.tokenizer, cfg.device_eval_batch_size, key,
                                                              self.data_share))
                             for prefix, key, section in eval_sections(cfg)]
        # metrics/train/<Name> of every batch (model.use_train_metrics) and the eval loaders' metric names
        self.train_metrics = LanguageMetrics(train_metric_names(cfg.model.settings), self.device, self.loss.offset)
        self.eval_metric_names = eval_metric_names(cfg.model.settings)
        self.icl = TrainingICL(  # (validation has made sure that an eval_gauntlet comes with icl_tasks)
            cfg.icl_tasks, cfg.eval_gauntlet, self.tokenizer, batch_size=cfg.device_eval_batch_size,
            max_seq_len=cfg.icl_seq_len or cfg.max_seq_len, precision=cfg.precision,
            subset_num_batches=icl_subset(cfg.icl_subset_num_batches, cfg.eval_subset_num_batches),
        ) if cfg.icl_tasks else None
        self.can_evaluate = bool(self.eval_loaders) or self.icl is not None
        self.last_icl_metrics: dict[str, float] = {}
        self.intervals = run_intervals(cfg, loader_length(self.train_loader))
        self.rates = self.intervals.rates
        self.schedule = build_schedule(cfg.scheduler, self.rates)
        # Composer's timing: the schedule reads the trainer's time, not LambdaLR's step count (see train_step)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: self.schedule(self.time))
        self.state = TrainState(  # what callbacks receive; they act on the run through its methods (services)
            run_name=self.run_name, dist=self.dist, precision=cfg.precision, data_share=self.data_share,
            model=self.model, tokenizer=self.tokenizer, loggers=self.loggers, optimizer=self.optimizer,
            optimizer_name=cfg.optimizer.name, scheduler=self.scheduler, rates=self.rates,
            eval_loaders=self.eval_loaders, icl_evaluator=self.icl.evaluator if self.icl else None,
            model_section=cfg.model, save_folder=cfg.save_folder, checkpoint_upload=cfg.checkpoint_upload,
            preemption=self.preemption, log_to_console=cfg.log_to_console, time=self.time, _services=self)
        self.state.end_at(self.rates.max_duration_batches)
        self.saved_batch = -1  # the batch of the newest checkpoint (save() sets it)
        self.checkpoint_components()  # a callback's state_name that clashes is refused before training
        self._resume()
        self.previous_time = TrainTime(**self.time.state_dict())  # the time before the last batch (tok / sp)
        self.checkpointer.check_can_write(resuming=self.time.batch > 0)

    # ----- set-up -----
    def _prepare_data(self) -> None:
        if self.dist.is_main:
            prepare(self.cfg.prepare_data)
        dist.barrier()

    def _resume(self) -> None:
        cfg = self.cfg
        path = None
        weights_only = cfg.load_weights_only
        if cfg.autoresume:  # validation made sure that save_folder is set
            latest = self.checkpointer.latest() or self.checkpointer.latest_composer()
            if latest is not None:
                path, weights_only = latest, False
        if path is not None:
            self._restore(path, weights_only, cfg.load_strict_model_weights, cfg.load_ignore_keys)
        elif cfg.load_path:
            self.restore(cfg.load_path, weights_only, cfg.load_strict_model_weights, cfg.load_ignore_keys)

    def restore(self, load_path: str, weights_only: bool, strict: bool, ignore_keys: list[str] | None) -> None:
        """Load a checkpoint of ours or Composer's, named as load_path names one, into this run (RunServices)."""
        staging = checkpointer.remote_staging(load_path, self.cfg.checkpoint_upload)
        self._restore(checkpointer.resolve_load_path(load_path, staging), weights_only, strict, ignore_keys)

    def _restore(self, path: str, weights_only: bool, strict: bool, ignore_keys: list[str] | None) -> None:
        self.checkpointer.wait()  # a background save (save_async) in flight finishes first
        ignore = compat.IgnoreKeys(ignore_keys)
        components = self.checkpoint_components(strict=strict)
        composer = composer_checkpoint.find_composer_checkpoint(path)
        if composer is not None:  # a checkpoint written by llm-foundry (Composer)
            composer_checkpoint.load_into_training(
                composer_checkpoint.read_composer_checkpoint(composer), components,
                optimizer_name=self.cfg.optimizer.name, weights_only=weights_only, strict=strict, ignore=ignore,
                rank=self.dist.rank, world_size=self.dist.world_size)
        else:
            checkpoint.load_checkpoint(path, components, weights_only=weights_only, strict=strict, ignore=ignore)
        source = composer if composer is not None else checkpoint.resolve_checkpoint(path)
        self.state.restored_from = str(source)
        self.state.print(f"resumed from {source} at batch {self.time.batch}")

    def checkpoint_components(self, strict: bool = True) -> dict[str, Component]:
        """What a checkpoint of this run holds (train.components): model, optimizer, rng, scheduler, time, the
        train loader's position, and the state of every callback that declares a ``state_name``."""
        components = training_components(self.model, self.optimizer, strict=strict)
        components["time"] = Component("time", self.time)
        components["scheduler"] = Component("scheduler", self.scheduler)
        components["dataloader"] = Component("dataloader", self.train_loader)
        for cb in self.callbacks:  # (a plugin callback need not subclass Callback)
            if (name := getattr(cb, "state_name", None)) is not None:
                if name in components:
                    raise ConfigError(f"callbacks: {type(cb).__name__}'s state_name '{name}' is already a checkpoint "
                                      "component's name (give the callback another state_name)")
                components[name] = Component(name, cb)
        return components

    # ----- the loop -----
    def fit(self) -> dict[str, float]:
        cfg = self.cfg
        if cfg.only_hf_checkpoint or cfg.only_composer_checkpoint:
            write_only_checkpoint(self)
            return {}
        if cfg.log_config:
            for logger in self.loggers:
                logger.log_hyperparameters(self.logged_config)
        for cb in self.callbacks:
            cb.on_fit_start(self.state)
        self._estimate_end()  # a resumed run: from the counts it trained
        bar = tqdm(total=self.max_batches, initial=self.time.batch, unit="ba", desc="train", dynamic_ncols=True,
                   disable=not (cfg.progress_bar and self.dist.is_main and sys.stderr.isatty()))
        last_eval_batch = -1
        if self.time.batch > 0:  # resumed: the checkpoint it started from is this batch's
            self.saved_batch = max(self.saved_batch, self.time.batch)
        if cfg.eval_first and self.time.batch == 0 and self.can_evaluate:
            self.evaluate()
            last_eval_batch = 0
        self.preemption.install()  # signal handlers for the loop (main thread only); put back after it
        with self.metrics_log.flushed_on_error():  # the batches trained before an error are logged, as they were
            last_eval_batch = self._train_loop(bar, last_eval_batch)
        bar.close()
        self.preemption.uninstall()
        self.flush_metrics()
        last_metrics = dict(self.metrics_log.last)  # every key's newest value, eval_first's included
        if self.can_evaluate and self.intervals.periodic_eval and last_eval_batch != self.time.batch:
            last_metrics.update(self.evaluate())
        if cfg.save_folder and self.saved_batch != self.time.batch:
            self.save()
        uploaded = self.finish_uploads()
        for cb in self.callbacks:
            cb.on_fit_end(self.state)
        self._summary()
        for logger in self.loggers:
            logger.close()
        if not uploaded:  # after the loggers closed: what was trained is logged; the newest upload is not usable
            raise TrainingStopped(self.checkpointer.upload_failure())
        return last_metrics

    def _train_loop(self, bar, last_eval_batch: int) -> int:
        """Batches until max_duration (or a stop request); returns the batch of the last evaluation."""
        cfg = self.cfg
        while self.time.batch < self.max_batches:
            progressed = False
            for device_batch in self.train_loader:
                progressed = True
                metrics = self.train_step(device_batch)
                self.metrics_log.land()  # the previous interval's values, read now that this step is queued (GPU)
                bar.update(1)
                step = self.time.batch
                if self.can_evaluate and self.intervals.periodic_eval and self._due_eval():
                    metrics.update(self.evaluate(log=False))
                    last_eval_batch = step
                # the metrics stay tensors until a log interval (step_metrics): then read, logged and printed
                logged = self._log(metrics, console=self._due(self.intervals.log_every, self.intervals.log_counted)
                                   or step == self.max_batches)
                if logged is not None and "loss/train/total" in logged:
                    bar.set_postfix(loss=f"{logged['loss/train/total']:.4f}")
                if self._due_save() and self.saved_batch != step:  # (a callback may have saved this batch)
                    self.save()
                if (reason := self.preemption.should_stop(step)) is not None and step < self.max_batches:
                    preemption.stop_for_preemption(self, reason, saved=self.saved_batch == step)  # exits
                if step >= self.max_batches:
                    break
                if 0 < cfg.train_subset_num_batches <= self.time.batch_in_epoch:  # the epoch ends here
                    self.time.epoch += 1
                    self.time.batch_in_epoch = 0
                    break
            else:
                self.time.epoch += 1
                self.time.batch_in_epoch = 0
            if not progressed:
                raise ConfigError("train_loader: yielded no batches (is the dataset smaller than one batch?)")
        return last_eval_batch

    def train_step(self, device_batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        """One optimizer step on a device batch. Its metrics are device tensors (or step_metrics.Derived) until
        a log interval reads them: ``float(value)`` reads one at once (a device sync)."""
        check_token_ids(device_batch, self.vocab_size)  # on the loader's CPU tensors: no device sync
        local_tokens = step_metrics.host_token_count(device_batch)  # the same: counted before the copy
        device_batch = {k: v.to(self.device, non_blocking=True) for k, v in device_batch.items()}
        self.state.batch = device_batch
        self.state.metrics = metrics = {}
        for cb in self.callbacks:
            cb.on_batch_start(self.state)
        self.parallel_model.train()
        num_samples = device_batch["input_ids"].size(0)
        targets = dist.all_reduce_sum(self.loss.targets(device_batch["labels"]).float())
        if not self.cfg.accumulate_train_batch_on_tokens:  # Composer's per-sample rule: normalise by samples
            # (every rank's samples, a TP group's counted once per rank: it cancels with the world-size scaling)
            targets = torch.full((), float(num_samples * self.dist.world_size), device=targets.device)
        while True:
            self.train_metrics.reset()
            try:
                loss_sum, aux = self._forward_backward(device_batch, targets)
                oom = False
            except torch.cuda.OutOfMemoryError:
                if not self.auto_microbatch:
                    raise
                oom = True
            if self.auto_microbatch and self.device.type == "cuda" and self.dist.world_size > 1:
                oom = host_sums.host_sum(int(oom)) > 0  # on the host: no device sync per step
            if not oom:
                break
            if self.microbatch_size == 1:
                raise TrainingStopped("device_train_microbatch_size: out of memory even with microbatches of 1 "
                                      "sample (use a smaller model, fsdp_config or activation_checkpointing)")
            # Redo the whole step with smaller microbatches: gradients restart from zero and the per-token
            # normalisation does not depend on the split, so the math is the same.
            self.optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            self.microbatch_size = max(1, self.microbatch_size // 2)
            log.warning("out of memory: device_train_microbatch_size is now %d", self.microbatch_size)
        loss = dist.all_reduce_sum(loss_sum) / targets.clamp(min=1)
        # an MoE's weighted load-balancing loss, logged as llm-foundry does (loss/train/lbl)
        aux = dist.all_reduce_sum(aux) / targets.clamp(min=1) if aux is not None else None

        if step_metrics.should_skip(self.callbacks, self.state, loss):  # reads the loss only for a callback deciding
            self.optimizer.zero_grad(set_to_none=True)
            metrics["train/skipped_step"] = 1.0
            if self.scaler:
                self.scaler.update()
        else:
            if self.scaler:
                self.scaler.unscale_(self.optimizer)
            for algorithm in self.algorithms:
                norm = algorithm.clip(self.parallel_model)
                if norm is not None:
                    metrics["grad_norm"] = norm
            if self.scaler:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            for cb in self.callbacks:
                cb.on_optimizer_step(self.state, metrics)
            self.optimizer.zero_grad(set_to_none=True)
        # As Composer does: the schedule is evaluated before the time advances, so step k >= 2 uses its value
        # after k - 2 batches and the first value serves two steps; a resumed run restores the same lr.
        self.scheduler.step()

        self.previous_time = TrainTime(**self.time.state_dict())  # for intervals in tok / sp
        self.time.batch += 1
        self.time.batch_in_epoch += 1
        self.time.sample += num_samples * self.data_share.size
        self.state.host_sums = host_sums.batch_sums(local_tokens, self.callbacks, self.state)  # one collective
        self.time.token += int(self.state.host_sums["tokens"]) // self.data_share.replication  # exact, no sync
        self._estimate_end()  # before the callbacks' on_batch_end, which may stop training here
        metrics.update(step_metrics.loss_metrics(loss, aux))  # a non-finite loss is warned of when it is read
        metrics.update(step_metrics.train_metrics(self.train_metrics, "metrics/train"))
        metrics.update(self.time.as_metrics())
        metrics.update(self.checkpointer.metrics())
        for cb in self.callbacks:
            cb.on_batch_end(self.state, metrics)
        return metrics

    def _forward_backward(self, device_batch: dict[str, torch.Tensor],
                          targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Accumulate the gradients of one device batch in microbatches; returns the summed (local) loss and the
        summed auxiliary (load-balancing) loss it includes, None for a model without one."""
        cfg = self.cfg
        torch.manual_seed(cfg.seed + self.time.batch * self.data_share.size + self.data_share.rank)  # dropout RNG, alike in TP groups
        num_samples = device_batch["input_ids"].size(0)
        loss_sum = torch.zeros((), device=self.device)
        aux_sum = None
        starts = list(range(0, num_samples, self.microbatch_size))
        for i, start in enumerate(starts):
            micro = {k: v[start:start + self.microbatch_size] for k, v in device_batch.items()}
            is_last = i == len(starts) - 1
            with parallel.gradient_sync(self.parallel_model, is_last or self.dist.world_size == 1), \
                    parallel.activation_offload(cfg.fsdp_config, self.device):
                with precision.autocast(cfg.precision, self.device):
                    output = self.parallel_model(**self._model_inputs(micro))
                logits = output.logits
                micro_loss = self.loss(logits, micro["labels"], reduction="sum")
                if self.train_metrics:
                    self.train_metrics.update(logits, micro["labels"], loss_sum=micro_loss)
                if not cfg.accumulate_train_batch_on_tokens:  # the microbatch's mean loss, weighted by its samples
                    micro_loss = micro_loss / self.loss.targets(micro["labels"]).clamp(min=1) * len(micro["labels"])
                aux = aux_loss_sum(output, micro["labels"], self.loss, cfg.accumulate_train_batch_on_tokens)
                if aux is not None:  # llm-foundry's total: each microbatch's mean loss + moe_loss_weight * lbl
                    micro_loss = micro_loss + aux
                    aux_sum = aux.detach() if aux_sum is None else aux_sum + aux.detach()
                # Normalise by the tokens of the whole global batch; DDP/FSDP average over ranks, so undo that.
                scaled = micro_loss * self.dist.world_size / targets.clamp(min=1)
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            for cb in self.callbacks:
                cb.on_after_backward(self.state, micro, logits)
            loss_sum += micro_loss.detach()
        return loss_sum, aux_sum

    def _model_inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return model_inputs(batch, self.model.supports_sequence_id)

    @torch.no_grad()
    def evaluate(self, log: bool = True) -> dict[str, float]:
        """Loss and perplexity over the eval loader, then the ICL tasks and gauntlet, when configured."""
        metrics: dict[str, float] = {}
        for cb in self.callbacks:
            cb.on_eval_start(self.state)
        for prefix, loader in self.eval_loaders:
            metrics.update(self._eval_loss(prefix, loader))
        if self.icl is not None:
            self.last_icl_metrics = self.icl.evaluate(self.model, self.device, self.data_share)
            metrics.update(self.last_icl_metrics)
            shown = ", ".join(f"{k.removeprefix('icl/')}: {v:.3f}" for k, v in self.last_icl_metrics.items())
            self.state.print(f"[icl] batch {self.time.batch}: {shown}")
        for cb in self.callbacks:
            cb.on_eval_end(self.state, metrics)
        if log:
            self._log(metrics, console=False, flush=True)
        return metrics

    def _eval_loss(self, prefix: str, loader) -> dict[str, float]:
        """Loss, perplexity and token accuracy over one eval loader (all of it, or eval_subset_num_batches)."""
        self.parallel_model.eval()
        metrics = evaluate_loader(self.model, loader, prefix=prefix, names=self.eval_metric_names, device=self.device,
                                  precision=self.cfg.precision, subset_num_batches=self.cfg.eval_subset_num_batches,
                                  vocab_size=self.vocab_size, supports_sequence_id=self.model.supports_sequence_id)
        loss = metrics[f"{prefix}/LanguageCrossEntropy"]
        if prefix == self.eval_loaders[0][0]:  # the first loader's losses make the summary
            self.history.losses.append((self.time.batch, loss))
        self.state.print(f"[{prefix.removeprefix('metrics/')}] batch {self.time.batch}: loss {loss:.4f}, perplexity "
                    f"{metrics[f'{prefix}/LanguagePerplexity']:.2f}")
        return metrics

    # ----- max_duration, eval_interval and save_interval in tok / sp (counted as Composer counts them) -----
    @property
    def max_batches(self) -> int:
        return self.state.max_batches

    def _estimate_end(self) -> None:
        end = self.intervals.counted_end
        if end is not None:
            nominal = self.rates.tokens_per_batch if end.unit == "tok" else self.rates.samples_per_batch
            self.state.end_at(estimated_last_batch(end, self.time, nominal))

    def _due(self, every_batches: int, interval: Time | None) -> bool:
        return interval_due(every_batches, interval, self.previous_time, self.time)

    def _due_eval(self) -> bool:
        return self._due(self.intervals.eval_every, self.intervals.eval_counted)

    def _due_save(self) -> bool:
        return bool(self.cfg.save_folder) and self._due(self.intervals.save_every, self.intervals.save_counted)

    # ----- checkpoints and logging -----
    def save(self) -> str:
        self.flush_metrics()  # the loggers' steps stay in order: pending batches' metrics before the checkpoint
        name = checkpoint.checkpoint_name(self.time.epoch, self.time.batch)
        self.saved_batch = self.time.batch
        path = self.checkpointer.save(
            name, self.checkpoint_components(), config=self.config_plain, tokenizer=self.tokenizer,
            weights_only=self.cfg.save_weights_only, ignore=compat.IgnoreKeys(self.cfg.save_ignore_keys),
            full_weights=self.cfg.fsdp_config is not None and self.cfg.fsdp_config.state_dict_type == "full")
        self.state.print(f"saved checkpoint {path}{self.checkpointer.note}")
        for cb in self.callbacks:
            cb.on_checkpoint_saved(self.state, str(path))
        epoch, batch = self.time.epoch, self.time.batch  # loggers (artifacts) see the checkpoint once it is written
        self.checkpointer.when_written(lambda: [lg.log_checkpoint(str(path), epoch, batch) for lg in self.loggers])
        return path

    def _log(self, metrics: dict[str, Any], console: bool, flush: bool = False) -> dict[str, float] | None:
        """Queue this batch's metrics; at a console interval (or ``flush``) log every queued batch (and print this
        one's line) and return this one's values, read from the device in one transfer. On a GPU a console interval
        other than the last batch is read after the next step is queued (MetricsLog's lag): None then."""
        lag = console and not flush and self.time.batch < self.max_batches
        return self.metrics_log.log(self.time.batch, metrics, flush=console or flush, console=console, lag=lag)

    def flush_metrics(self) -> None:
        """Log the queued batches' metrics now (RunServices: before a callback logs a table at this step)."""
        self.metrics_log.flush()

    def save_now(self) -> None:
        """A just-in-time checkpoint (RunServices), complete when this returns: saved now unless this batch is saved
        already (a batch due for an interval or the end-of-training save is saved here, and the loop then does not
        save it again)."""
        preemption.save_now(self, saved=self.saved_batch == self.time.batch)

    def finish_uploads(self) -> bool:
        return self.checkpointer.finish(self.cfg.checkpoint_upload.wait_at_end_s)

    def _summary(self) -> None:
        if len(self.history.losses) >= 2:
            (b0, first), (b1, last) = self.history.losses[0], self.history.losses[-1]
            self.state.print(f"eval loss: {first:.4f} (batch {b0}) -> {last:.4f} (batch {b1}), "
                        f"ratio {last / first:.3f}")
        if self.icl is not None and self.last_icl_metrics:
            self.state.print(self.icl.tables(self.last_icl_metrics, self.run_name))
