"""generate_callback (Composer's Generate): every ``interval`` (and at the end of training), complete each of
``prompts`` with the model being trained and log the table ``generations`` (columns prompt, generation).

The remaining keys are passed to the model's ``generate`` (Hugging Face's), as Composer passes its extra keyword
arguments; the ones listed here are accepted. Every rank takes part (FSDP gathers the weights for each step), rank 0
logs; the model returns to training mode afterwards.
"""

from __future__ import annotations

import logging
import time

import torch

from llmfoundry.core import precision
from llmfoundry.core.errors import ConfigError
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.callbacks.settings import GenerateSettings
from llmfoundry.train.callbacks.tables import log_table
from llmfoundry.train.state import TrainState

log = logging.getLogger(__name__)
KEY = "callbacks.generate_callback"


class Generate(Callback):
    def __init__(self, settings: GenerateSettings):
        self.s = settings
        self.every = 0
        self.last_batch = -1
        self.rows: list[list[str]] = []  # the last table (rank 0)

    def on_fit_start(self, state: TrainState):
        try:
            self.every = max(1, state.rates.to_batches(self.s.interval, f"{KEY}.interval"))
        except ValueError as error:
            raise ConfigError(str(error)) from None

    def on_batch_end(self, state: TrainState, metrics):
        if state.time.batch % self.every == 0:
            self.generate(state)

    def on_fit_end(self, state: TrainState):
        if self.last_batch != state.time.batch:
            self.generate(state)

    def generate(self, state: TrainState) -> None:
        self.last_batch = state.time.batch
        start = time.perf_counter()
        model, tokenizer = state.model, state.tokenizer
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
                ids = encoded["input_ids"][i:i + step].to(state.device)
                mask = encoded["attention_mask"][i:i + step].to(state.device)
                with torch.no_grad(), precision.autocast(state.precision, state.device):
                    out = model.generate(input_ids=ids, attention_mask=mask, synced_gpus=state.dist.world_size > 1,
                                         **self.s.generate_kwargs())
                outputs.extend(out[:, width:])
        except (TypeError, ValueError) as error:
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise ConfigError(f"{KEY}: the model's generate refused the settings: {first}") from None
        finally:
            tokenizer.padding_side = padding_side
            model.train(was_training)
        if state.dist.is_main:
            self.rows = [[prompt, tokenizer.decode(new, skip_special_tokens=True)]
                         for prompt, new in zip(self.s.prompts, outputs)]
            log_table(state, "generations", ["prompt", "generation"], self.rows, KEY)
        log.info("generate_callback: %d prompts in %.1f s", len(self.s.prompts), time.perf_counter() - start)


def build_generate(settings: GenerateSettings) -> Callback:
    return Generate(settings)
