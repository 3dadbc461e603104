"""When things happen in a run: max_duration, eval_interval, save_interval and console_log_interval, in batches
(and, for times in tok / sp, as Composer counts them: see core/timeunits)."""

from __future__ import annotations

from dataclasses import dataclass

from llmfoundry.core.errors import ConfigError
from llmfoundry.core.timeunits import Rates, Time, counted, counted_interval
from llmfoundry.train.recipe import TrainConfig


@dataclass(frozen=True)
class RunIntervals:
    rates: Rates  # rates.max_duration_batches: max_duration in batches (an estimate for tok / sp)
    eval_every: int
    save_every: int
    log_every: int
    counted_end: Time | None  # max_duration in tok / sp: compared with what was trained
    eval_counted: Time | None  # the intervals in tok / sp
    save_counted: Time | None
    log_counted: Time | None
    periodic_eval: bool  # False: eval_interval 0 turns evaluation off, also at the end of training


def loader_length(loader) -> int | None:
    """The batches of one epoch; None when the loader cannot tell (an iterable of unknown length)."""
    try:
        return len(loader)
    except TypeError:
        return None


def run_intervals(cfg: TrainConfig, batches_per_epoch: int | None) -> RunIntervals:
    """The recipe's times in batches; ``batches_per_epoch`` is the train loader's length (None: unknown)."""
    if batches_per_epoch is not None and cfg.train_subset_num_batches > 0:  # epochs end after this many batches
        batches_per_epoch = min(batches_per_epoch, cfg.train_subset_num_batches)
    if batches_per_epoch == 0:
        raise ConfigError(f"train_loader: the dataset has fewer samples than one batch "
                          f"({cfg.global_train_batch_size}); add data or lower global_train_batch_size")
    base = Rates(batches_per_epoch, cfg.global_train_batch_size, cfg.global_train_batch_size * cfg.max_seq_len)
    try:
        total = base.to_batches(cfg.max_duration, "max_duration")
        rates = Rates(base.batches_per_epoch, base.samples_per_batch, base.tokens_per_batch, total,
                      Time.parse(cfg.max_duration))
        eval_counted, save_counted, log_counted = (  # (max_batches is an estimate for these)
            counted_interval(i, cfg.max_duration)
            for i in (cfg.eval_interval, cfg.save_interval, cfg.console_log_interval))
        eval_every = rates.to_batches(cfg.eval_interval, "eval_interval")  # (a bad value is named here first)
        eval_interval = Time.parse(cfg.eval_interval)
        intervals = RunIntervals(
            rates=rates,
            eval_every=eval_every,
            save_every=rates.to_batches(cfg.save_interval, "save_interval"),
            log_every=max(1, rates.to_batches(cfg.console_log_interval, "console_log_interval")),
            counted_end=counted(cfg.max_duration), eval_counted=eval_counted, save_counted=save_counted,
            log_counted=log_counted,
            # eval_interval 0 (0ba, 0ep, ...) turns evaluation off, also at the end of training, as in Composer
            # (eval_first still evaluates before the first batch); 0dur stays an error (Composer fails on it too)
            periodic_eval=not (eval_interval.value == 0 and eval_interval.unit != "dur"))
    except ValueError as error:
        raise ConfigError(str(error)) from None
    for key, every in (("eval_interval", intervals.eval_every), ("save_interval", intervals.save_every)):
        if every < 1 and (key != "eval_interval" or intervals.periodic_eval):
            raise ConfigError(f"{key}: must be at least one batch, got '{getattr(cfg, key)}'")
    return intervals
