"""Checkpoints beside the run's own: mono_checkpoint_saver (llm-foundry's MonolithicCheckpointSaver) and
load_checkpoint (Composer's LoadCheckpoint).

mono_checkpoint_saver writes, every ``batch_interval`` batches and at the end of training, one file
``{save_folder}/{filename}`` (local or s3://) with the full, unsharded model weights gathered from every rank.
Its layout is Composer's monolithic checkpoint: ``torch.save({"state": {"model": {name: tensor}, "timestamp":
{"Timestamp": {...}}, "run_name": ...}, "rng": []})`` with Composer's parameter names (``model.`` + the model's
own), so ``load_path`` reads it as a Composer checkpoint (weights, and the time unless load_weights_only); it holds
no optimizer state (the run's own checkpoints in save_folder have it), no Hugging Face config (so ``convert``
cannot rebuild a model from it alone) and none of Composer's objects (so Composer cannot resume from it).

load_checkpoint loads a checkpoint (ours or Composer's, local or s3://) into the run at its start, as the trainer
loads load_path. Composer runs it at an event: ``before_load`` (the default) is before the run's own
load_path/autoresume checkpoint, which then replaces it, so here it is loaded only when the run loaded none;
``after_load`` and ``fit_start`` load it after the run's own, over it.
"""

from __future__ import annotations

import io

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from llmfoundry.core import dist, objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.core.notices import notice_once
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.callbacks.param_names import composer_name
from llmfoundry.train.callbacks.settings import NAME_FIELDS, LoadCheckpointSettings, MonoCheckpointSaverSettings
from llmfoundry.train.state import TrainState

KEY = "callbacks.mono_checkpoint_saver"


class MonoCheckpointSaver(Callback):
    def __init__(self, settings: MonoCheckpointSaverSettings):
        self.s = settings
        self.written: list[str] = []  # rank 0: the files, in order

    def on_batch_end(self, state: TrainState, metrics):
        if state.time.batch % self.s.batch_interval == 0:
            self.save(state)

    def on_fit_end(self, state: TrainState):
        if state.time.batch % self.s.batch_interval != 0:
            self.save(state)

    def save(self, state: TrainState) -> None:
        """Collective: every rank gathers its shards; rank 0 writes the file."""
        fields = dict(vars(state.time), run_name=state.run_name, rank=dist.rank(), world_size=dist.world_size())
        try:
            folder, filename = self.s.save_folder.format(**fields), self.s.filename.format(**fields)
        except (KeyError, IndexError, ValueError) as error:
            raise ConfigError(f"callbacks.mono_checkpoint_saver: '{self.s.filename}' names an unknown field "
                              f"({error}); use {', '.join('{' + n + '}' for n in NAME_FIELDS)}") from None
        target = objectstore.join(folder, filename)
        # as Composer: a local file is replaced; an upload over an existing object needs overwrite
        remote_clash = objectstore.is_remote(folder) and not self.s.overwrite and dist.broadcast_object(
            objectstore.ObjectFolder(folder, KEY).exists(filename) if dist.rank() == 0 else None)
        if remote_clash:
            raise ConfigError(f"{KEY}: '{target}' already exists (set overwrite: true or choose another save_folder)")
        weights = get_model_state_dict(state.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if dist.rank() == 0:
            # Composer's Timestamp fields; sample_in_epoch is where a resumed train loader continues
            timestamp = dict(vars(state.time), sample_in_epoch=state.time.batch_in_epoch *
                             state.rates.samples_per_batch)
            composer_state = {"model": {composer_name(name): value for name, value in weights.items()},
                              "timestamp": {"Timestamp": timestamp}, "run_name": state.run_name}
            buffer = io.BytesIO()
            torch.save({"state": composer_state, "rng": []}, buffer)
            objectstore.write_bytes(target, buffer.getvalue())
            self.written.append(target)
            state.print(f"mono_checkpoint_saver: wrote {target}")
        dist.barrier()


class LoadCheckpoint(Callback):
    def __init__(self, settings: LoadCheckpointSettings):
        self.s = settings
        self.loaded = False

    def on_fit_start(self, state: TrainState):
        s = self.s
        if s.event.lower() in ("init", "before_load") and state.restored_from is not None:
            notice_once(f"callbacks.load_checkpoint: not loaded: the run's own checkpoint {state.restored_from} "
                        f"replaces it (event: {s.event}; use event: after_load to load it over the run's own)")
            return
        state.restore(s.load_path, s.load_weights_only, s.strict_model_weights, s.ignore_keys)
        self.loaded = True


def build_mono_checkpoint_saver(settings: MonoCheckpointSaverSettings) -> Callback:
    return MonoCheckpointSaver(settings)


def build_load_checkpoint(settings: LoadCheckpointSettings) -> Callback:
    return LoadCheckpoint(settings)
