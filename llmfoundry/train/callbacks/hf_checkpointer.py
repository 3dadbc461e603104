"""hf_checkpointer: every ``save_interval`` (and at the end of training), export the model as a Hugging Face folder
that transformers loads with its own classes (no ``trust_remote_code``).

Layout, as llm-foundry's HuggingFaceCheckpointer writes it::

    {save_folder}/huggingface/{huggingface_folder_name}/    default name ba{batch}: .../huggingface/ba4/
        config.json  generation_config.json  model.safetensors  tokenizer files
        .complete                                           s3:// only: uploaded last

The weights are gathered from every rank (FSDP shards included) into a fresh copy of the model on rank 0, which
``llmfoundry.models.hf_export.export_hf`` writes. A reader never sees a half-written export under its final name:
a local export is written to a hidden sibling folder and renamed; an ``s3://`` export is written to the local
staging folder (``checkpoint_upload.staging_folder``, or one under the system temp dir) and uploaded by a
background thread with ``checkpoint_upload``'s retries, ``config.json`` (what loaders recognise a model folder
by) and the ``.complete`` marker last (``llmfoundry.train.uploads.publish_folder``). Training waits for pending
uploads at its end, for at most ``checkpoint_upload.wait_at_end_s``.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from llmfoundry.core import dist, objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.core.notices import notice_once
from llmfoundry.models.hf_export import export_hf
from llmfoundry.train import uploads
from llmfoundry.train.builders import build_model
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.callbacks.settings import NAME_FIELDS, HFCheckpointerSettings
from llmfoundry.train.errors import TrainingStopped
from llmfoundry.train.state import TrainState

log = logging.getLogger(__name__)
KEY = "callbacks.hf_checkpointer"
SUBFOLDER = "huggingface"  # llm-foundry's: exports sit under save_folder/huggingface/


class HFCheckpointer(Callback):
    def __init__(self, settings: HFCheckpointerSettings):
        self.s = settings
        self.remote = objectstore.is_remote(settings.save_folder)
        self.every = None
        self.last = -1
        self.exported: list[str] = []  # rank 0: the folders (or URLs) written, in order
        self.failed: list[str] = []  # rank 0: URLs whose upload did not finish
        self._uploads: ThreadPoolExecutor | None = None
        self._pending: list[tuple[str, Path, Future]] = []  # (URL, staged folder, upload)
        if settings.final_register_only:
            notice_once(f"{KEY}.final_register_only: has no effect without mlflow_registered_model_name; the final "
                        "model is exported to save_folder (as llm-foundry does)")

    def on_fit_start(self, state: TrainState):
        try:
            self.every = max(1, state.rates.to_batches(self.s.save_interval, f"{KEY}.save_interval"))
        except ValueError as error:
            raise ConfigError(str(error)) from None
        if self.remote:  # an unreachable store or a missing bucket: say so now rather than after the first interval
            _agree(self._check_store)

    def on_batch_end(self, state: TrainState, metrics):
        if state.time.batch % self.every == 0:
            self.export(state, wait=False)

    def on_fit_end(self, state: TrainState):
        if self.last != state.time.batch:
            self.export(state, wait=False)
        self.finish(state.checkpoint_upload.wait_at_end_s)

    def folder_name(self, state: TrainState) -> str:
        fields = dict(vars(state.time), run_name=state.run_name, rank=dist.rank(), world_size=dist.world_size())
        return self.s.huggingface_folder_name.format(**{k: fields[k] for k in NAME_FIELDS})

    def export(self, state: TrainState, wait: bool = True) -> str | None:
        """Collective: every rank calls it. Rank 0 writes the export and returns its folder or URL. With
        ``wait=False`` an upload to an object store may still be running when it returns (see :meth:`finish`);
        with ``wait=True`` (only_hf_checkpoint, where the export is the whole point) a failed upload stops the run."""
        self.last = state.time.batch
        name = self.folder_name(state)
        target = objectstore.join(self.s.save_folder, SUBFOLDER, name)
        if not self.s.overwrite:
            _agree(lambda: self._refuse_existing(target))
        full = get_model_state_dict(state.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if dist.rank() == 0:
            copy = self._model_copy(state)
            copy.load_state_dict(full)
            if self.remote:
                # numbered, so that an export of a name whose previous upload is still running gets its own copy
                staged = self._staging(state) / SUBFOLDER / f"{name}.{len(self.exported)}"
                shutil.rmtree(staged, ignore_errors=True)
                export_hf(copy.eval(), state.tokenizer, staged, self.s.precision)
                self._upload(state, staged, target)
                state.print(f"hf_checkpointer: exported batch {state.time.batch}, uploading to {target}")
            else:
                _write_local(copy.eval(), state.tokenizer, Path(target), self.s.precision)
                state.print(f"hf_checkpointer: exported {target}")
            self.exported.append(target)
        dist.barrier()
        if wait and not self.finish(state.checkpoint_upload.wait_at_end_s):
            raise TrainingStopped(f"hf_checkpointer: not uploaded completely: {', '.join(self.failed)} (see the log)")
        return target if dist.rank() == 0 else None

    def finish(self, timeout_s: float) -> bool:
        """Wait (rank 0) for pending uploads, at most ``timeout_s`` in all; False if any did not complete."""
        deadline = time.monotonic() + timeout_s
        for url, staged, future in self._pending:
            try:
                future.result(timeout=max(0.0, deadline - time.monotonic()))
            except Exception as error:  # noqa: BLE001 - a timeout or the upload's own error; both are reported
                self.failed.append(url)
                log.error("hf_checkpointer: the export %s was not uploaded completely (%s: %s); its files are in %s",
                          url, type(error).__name__, error, staged)
        self._pending = []
        return not self.failed

    # -- rank 0 --
    def _model_copy(self, state: TrainState):
        section = state.model_section
        settings = section.settings
        if dataclasses.is_dataclass(settings) and getattr(settings, "init_device", None) in ("meta", "mixed"):
            settings = dataclasses.replace(settings, init_device="cpu")
        return build_model(dataclasses.replace(section, settings=settings), state.tokenizer)

    def _staging(self, state: TrainState) -> Path:
        return objectstore.staging_root(self.s.save_folder, state.checkpoint_upload.staging_folder)

    def _upload(self, state: TrainState, staged: Path, url: str) -> None:
        upload = state.checkpoint_upload
        if self._uploads is None:  # one worker: exports reach the store in the order they were made
            self._uploads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-export-upload")

        def run() -> None:
            def on_retry(error: Exception, wait: float) -> None:
                log.warning("hf_checkpointer: upload to %s: %s; retrying in %.1f s", url, type(error).__name__, wait)

            retry = objectstore.Retry(time.monotonic() + upload.timeout_s, upload.initial_backoff_s,
                                      upload.max_backoff_s, on_retry)
            uploads.publish_folder(staged, url, retry, last=("config.json",))
            shutil.rmtree(staged, ignore_errors=True)  # kept after a failure, so the export is not lost

        self._pending.append((url, staged, self._uploads.submit(run)))

    def _check_store(self) -> str | None:
        try:
            objectstore.ObjectFolder(self.s.save_folder, f"{KEY}.save_folder", max_attempts=3,
                                     stores=objectstore.CHECKPOINT_STORES).probe()
        except ConfigError as error:
            return str(error)
        except Exception as error:  # noqa: BLE001 - botocore: no credentials, no endpoint, no bucket, ...
            return str(objectstore.explain(error, self.s.save_folder, f"{KEY}.save_folder"))
        return None

    def _refuse_existing(self, target: str) -> str | None:
        if self.remote:
            try:
                exists = bool(objectstore.ObjectFolder(target, f"{KEY}.save_folder", max_attempts=3,
                                                  stores=objectstore.CHECKPOINT_STORES).list_keys())
            except Exception as error:  # noqa: BLE001 - botocore errors, explained in one line
                return str(objectstore.explain(error, target, f"{KEY}.save_folder"))
        else:
            exists = Path(target).exists()
        if exists:
            return (f"{KEY}.overwrite: the export '{target}' already exists and overwrite is false (set "
                    "overwrite: true, or choose another save_folder or huggingface_folder_name)")
        return None


def _write_local(model, tokenizer, target: Path, precision: str) -> None:
    """Export into a hidden sibling of ``target`` and rename it, so ``target`` is never seen half-written."""
    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    export_hf(model, tokenizer, partial, precision)  # any name in core.precision.DTYPES
    if target.exists():
        shutil.rmtree(target)
    partial.rename(target)


def _agree(check) -> None:
    """Run ``check`` on rank 0 (it returns an error message or None) and raise that error on every rank, so that
    no rank is left waiting in a collective for one that stopped."""
    problem = dist.broadcast_object(check() if dist.rank() == 0 else None)
    if problem:
        raise ConfigError(problem)


def build_hf_checkpointer(settings: HFCheckpointerSettings) -> Callback:
    return HFCheckpointer(settings)
