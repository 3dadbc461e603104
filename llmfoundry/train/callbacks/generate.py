"""generate_callback (Composer's Generate): every ``interval`` (and at the end of training), complete each of
``prompts`` with the model being trained and log the table ``generations`` (columns prompt, generation).

The remaining keys are passed to the model's ``generate`` (Hugging Face's), as Composer passes its extra keyword
arguments; the ones listed here are accepted. Every rank takes part (FSDP gathers the weights for each step), rank 0
logs; the model returns to training mode afterwards.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, fields
from typing import Any

import torch

from llmfoundry.config.fields import option
from llmfoundry.core import precision
from llmfoundry.core.errors import ConfigError
from llmfoundry.registry import callbacks
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.callbacks.tables import log_table

log = logging.getLogger(__name__)
KEY = "callbacks.generate_callback"
OWN_KEYS = ("prompts", "interval", "batch_size")


@dataclass
class GenerateSettings:
    prompts: list[str] = option(doc="the prompts to complete")
    interval: str | int = option(doc="how often, e.g. 500ba or 1ep (an int is epochs); also at the end of training")
    batch_size: int | None = option(None, "prompts per generate call (default: all at once)")
    max_new_tokens: int | None = option(None, "generate's max_new_tokens")
    min_new_tokens: int | None = option(None, "generate's min_new_tokens")
    do_sample: bool | None = option(None, "generate's do_sample (sampling rather than greedy)")
    temperature: float | None = option(None, "generate's temperature")
    top_k: int | None = option(None, "generate's top_k")
    top_p: float | None = option(None, "generate's top_p")
    num_beams: int | None = option(None, "generate's num_beams")
    repetition_penalty: float | None = option(None, "generate's repetition_penalty")
    no_repeat_ngram_size: int | None = option(None, "generate's no_repeat_ngram_size")
    use_cache: bool | None = option(None, "generate's use_cache")
    eos_token_id: int | None = option(None, "generate's eos_token_id")
    pad_token_id: int | None = option(None, "generate's pad_token_id")

    def check_settings(self, path: str) -> list[str]:
        problems = [] if self.prompts else [f"{path}.prompts: give at least one prompt"]
        if self.batch_size is not None and self.batch_size <= 0:
            problems.append(f"{path}.batch_size: must be positive, got {self.batch_size}")
        return problems

    def generate_kwargs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in OWN_KEYS and getattr(self, f.name) is not None}


class Generate(Callback):
    def __init__(self, settings: GenerateSettings):
        self.s = settings
        self.every = 0
        self.last_batch = -1
        self.rows: list[list[str]] = []  # the last table (rank 0)

    def on_fit_start(self, trainer):
        try:
            self.every = max(1, trainer.rates.to_batches(self.s.interval, f"{KEY}.interval"))
        except ValueError as error:
            raise ConfigError(str(error)) from None

    def on_batch_end(self, trainer, metrics):
        if trainer.time.batch % self.every == 0:
            self.generate(trainer)

    def on_fit_end(self, trainer):
        if self.last_batch != trainer.time.batch:
            self.generate(trainer)

    def generate(self, trainer) -> None:
        self.last_batch = trainer.time.batch
        start = time.perf_counter()
        model, tokenizer = trainer.model, trainer.tokenizer
        was_training = model.training
        model.eval()
        padding_side = tokenizer.padding_side
        tokenizer.padding_side = "left"  # new tokens go on the right, after each prompt's last real token
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token_id = tokenizer.eos_token_id
        encoded = tokenizer(self.s.prompts, return_tensors="pt", padding=True)
        width = encoded["input_ids"].shape[1]
        step = self.s.batch_size or len(self.s.prompts)
        outputs: list[torch.Tensor] = []
        try:
            for i in range(0, len(self.s.prompts), step):
                ids = encoded["input_ids"][i:i + step].to(trainer.device)
                mask = encoded["attention_mask"][i:i + step].to(trainer.device)
                with torch.no_grad(), precision.autocast(trainer.cfg.precision, trainer.device):
                    out = model.generate(input_ids=ids, attention_mask=mask, synced_gpus=trainer.dist.world_size > 1,
                                         **self.s.generate_kwargs())
                outputs.extend(out[:, width:])
        except (TypeError, ValueError) as error:
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise ConfigError(f"{KEY}: the model's generate refused the settings: {first}") from None
        finally:
            tokenizer.padding_side = padding_side
            model.train(was_training)
        if trainer.dist.is_main:
            self.rows = [[prompt, tokenizer.decode(new, skip_special_tokens=True)]
                         for prompt, new in zip(self.s.prompts, outputs)]
            log_table(trainer, "generations", ["prompt", "generation"], self.rows, KEY)
        log.info("generate_callback: %d prompts in %.1f s", len(self.s.prompts), time.perf_counter() - start)


@callbacks.register("generate_callback", config=GenerateSettings, differs=(
    "the table goes to loggers that record tables (log_table); with none, to the console, with a notice"))
def build_generate(settings: GenerateSettings) -> Callback:
    return Generate(settings)
