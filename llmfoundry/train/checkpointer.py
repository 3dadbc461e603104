"""Where checkpoints go and where a run resumes from: a local folder or an object store (``s3://``, ``gs://``, Azure).

:class:`Checkpointer` saves through the checkpoint format (train.checkpoint): straight into a local save_folder,
or into a local staging folder whose files this rank's background uploader (train.uploads) sends to the store.
It also finds the newest complete checkpoint to resume from and downloads a remote ``load_path``.
"""

from __future__ import annotations

import os
from pathlib import Path

from llmfoundry.core import dist, objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.train import uploads
from llmfoundry.train.async_save import AsyncSaver
from llmfoundry.train.checkpoint import (
    Snapshot,
    latest_checkpoint,
    list_checkpoints,
    take_snapshot,
    write_job,
)
from llmfoundry.train.components import Component
from llmfoundry.train.composer_checkpoint import find_composer_checkpoint


class Checkpointer:
    """Saves to a local or ``s3://`` save_folder and finds the checkpoint to resume from.

    Local: train.checkpoint's atomic rename and ``latest``. S3: the checkpoint is written to a local staging
    folder and uploaded by this rank's background :class:`~llmfoundry.train.uploads.Uploader`; training goes on
    meanwhile, and the checkpoint becomes ``latest`` only once every rank's files are up. With
    ``save_async`` the write is done by a writer process (train.async_save) from a copy in shared host memory, and
    the upload, by that process too, starts once it is written.
    """

    def __init__(self, save_folder: str | None, upload_cfg=None, *, keep: int = -1, overwrite: bool = False,
                 save_async: bool = False):
        self.save_folder = save_folder
        # save_async: the loop waits only for a copy in shared memory; train.async_save's writer process writes it
        self.background = AsyncSaver() if save_async and save_folder else None
        self.keep = keep
        self.overwrite = overwrite
        self.upload_cfg = upload_cfg
        self.remote = objectstore.is_remote(save_folder)
        self.uploader: uploads.Uploader | None = None  # synchronous saves' uploads (save_async's: the writer's)
        self.unfinished = 0  # uploads still running when finish() stopped waiting
        self.failed: list[str] = []  # checkpoints whose upload failed (known at finish())
        self._announcements: list = []  # what to call once the checkpoint in flight is written (when_written)
        self._upload_settings: dict | None = None
        if self.remote:
            self.staging = remote_staging(save_folder, upload_cfg)
            self._upload_settings = dict(url=save_folder, rank=dist.rank())
            if upload_cfg is not None:
                self._upload_settings.update(timeout_s=upload_cfg.timeout_s,
                                             initial_backoff_s=upload_cfg.initial_backoff_s,
                                             max_backoff_s=upload_cfg.max_backoff_s)
            if self.background is None:
                self.uploader = uploads.Uploader(**self._upload_settings)

    def save(self, name: str, components: dict[str, Component], *, config: dict, tokenizer, **options) -> str:
        """Write checkpoint ``name`` of ``components`` (collective; ``options``: train.checkpoint.take_snapshot's);
        returns where it is (or will be, once written in the background or uploaded)."""
        where = f"{self.save_folder.rstrip('/')}/{name}" if self.remote else str(Path(self.save_folder) / name)
        if self.background is None:
            self._write(name, take_snapshot(components, **options), config, tokenizer)
            return where
        self.wait()  # one write in flight; its error (a ConfigError) is raised here
        optimizer = components["optimizer"].state.optimizer if "optimizer" in components else None
        self.background.snapshot(take_snapshot(components, **options), components["model"].state.model, optimizer)
        # the writer process writes it and, for an object store, uploads what it staged (no thread of this process)
        self.background.start(dict(self._job(name, config), tokenizer=self.background.tokenizer_files(tokenizer),
                                   upload=self._upload_settings))
        return where

    def _job(self, name: str, config: dict) -> dict:
        """train.checkpoint.write_job's arguments for checkpoint ``name`` (the tokenizer aside)."""
        return dict(name=name, folder=str(self.staging if self.remote else self.save_folder), remote=self.remote,
                    overwrite=self.overwrite, keep=self.keep, config=config)

    def _write(self, name: str, snapshot: Snapshot, config: dict, tokenizer) -> None:
        """Write (and for an object store, hand to this rank's uploader) one snapshot; collective."""
        staged, attempt = write_job(snapshot, **self._job(name, config), tokenizer=tokenizer)
        if staged is not None:
            self.uploader.submit(uploads.UploadJob(name, staged, dist.world_size(), self.keep, attempt))

    def wait(self) -> None:
        """Wait for a background write (save_async) in flight; raise its error. A no-op otherwise."""
        if self.background is not None:
            self.background.wait()
        self._announce()

    def when_written(self, announce) -> None:
        """Call ``announce()`` (e.g. loggers' log_checkpoint, which may upload the files as an artifact) once the
        checkpoint just saved is complete: now for a synchronous save, else when the background write is waited
        for (the next save, a restore, the end of training). An s3:// checkpoint is announced once its staged
        files are written; loggers reference it by URL."""
        self._announcements.append(announce)
        if self.background is None:
            self._announce()

    def _announce(self) -> None:
        pending, self._announcements = self._announcements, []
        for announce in pending:
            announce()

    @property
    def note(self) -> str:
        """What the log line of a save adds: where the checkpoint still is on its way."""
        if self.remote:
            return " (uploading)"
        return " (writing in the background)" if self.background is not None else ""

    def check_can_write(self, resuming: bool) -> None:
        """Fail up front, not at the first save in the middle of training, when save_folder would overwrite
        another run's checkpoints or (s3://) cannot be reached."""
        if not self.save_folder:
            return
        problem = None
        if dist.rank() == 0:
            try:
                if self.remote:
                    existing = uploads.RemoteCheckpoints(self.save_folder).complete_checkpoints()
                else:
                    existing = [p.name for p in list_checkpoints(self.save_folder)]
                if existing and not (self.overwrite or resuming):
                    problem = (f"save_folder: '{self.save_folder}' already holds checkpoints ({existing[-1]}); set "
                               "autoresume: true to continue, save_overwrite: true, or choose another save_folder")
            except ConfigError as error:
                problem = str(error)
            except Exception as error:  # noqa: BLE001 - boto raises many types; all mean "cannot use this folder"
                problem = str(objectstore.explain(error, self.save_folder, "save_folder"))
        if (problem := dist.broadcast_object(problem)) is not None:
            raise ConfigError(problem)

    def metrics(self) -> dict[str, float]:
        if not self.remote:
            return {}
        if self.background is not None:
            status = self.background.upload_status(max_age_s=1.0)  # every step: the writer is asked once a second
            return uploads.describe(status["pending"], status["retries"])
        return uploads.describe(self.uploader.pending(), self.uploader.retries)

    def finish(self, timeout_s: float) -> bool:
        """Wait for a background write (raising its error) and pending uploads (every rank); False if some uploads
        did not finish or failed."""
        if self.background is not None:
            self.background.release(upload_timeout_s=timeout_s if self.remote else 0.0)
            self._announce()
            status = self.background.uploads
            self.unfinished, self.failed = status["pending"], status["failed"]
            return not self.unfinished and not self.failed
        if self.uploader is None:
            return True
        done = self.uploader.wait(timeout_s)
        self.unfinished, self.failed = self.uploader.pending(), list(self.uploader.failed)
        self.uploader.close(0)
        return done and not self.failed

    def upload_failure(self) -> str:
        """One line on the uploads that did not complete (after finish() returned False)."""
        lost = self.failed + ([f"{self.unfinished} still uploading"] if self.unfinished else [])
        limit = f"checkpoint_upload.timeout_s: {self.upload_cfg.timeout_s:g} s" if self.upload_cfg else "the retry budget"
        return (f"save_folder: checkpoint upload to {self.save_folder} did not complete ({', '.join(lost)}; "
                f"{limit}); 'latest' still names the newest complete checkpoint: run the same command again to "
                "resume from it once the store answers")

    def latest(self) -> str | None:
        """The newest complete checkpoint in save_folder as a local path (downloaded when remote), or None."""
        if not self.save_folder:
            return None
        if not self.remote:
            path = latest_checkpoint(self.save_folder)
            return str(path) if path is not None else None
        found = None
        if dist.rank() == 0:
            try:
                found = ("ok", uploads.RemoteCheckpoints(self.save_folder).latest())
            except Exception as error:  # noqa: BLE001 - boto's errors: no such bucket, unreachable endpoint, ...
                found = ("error", str(objectstore.explain(error, self.save_folder, "save_folder")))
        status, name = dist.broadcast_object(found)
        if status == "error":
            raise ConfigError(name)
        if name is None:
            return None
        return fetch(self.save_folder, name, self.staging)

    def latest_composer(self) -> str | None:
        """The checkpoint Composer's ``latest-*`` pointer in save_folder names (a save_folder llm-foundry wrote,
        which autoresume continues as llm-foundry would), as a local path; None when there is none."""
        if not self.save_folder:
            return None
        if not self.remote:
            found = find_composer_checkpoint(self.save_folder)
            return str(found) if found is not None and found != Path(self.save_folder) else None
        pointer = None
        if dist.rank() == 0:
            try:
                pointer = _remote_composer_checkpoint(self.save_folder.rstrip("/"), pointers_only=True)
            except Exception as error:  # noqa: BLE001 - boto's errors, as in latest()
                pointer = str(objectstore.explain(error, self.save_folder, "save_folder"))
        pointer = dist.broadcast_object(pointer)
        if isinstance(pointer, str):
            raise ConfigError(pointer)
        return None if pointer is None else resolve_load_path("/".join(pointer), self.staging)


def fetch(url: str, name: str, staging: Path) -> str:
    """Download checkpoint ``name`` of the s3:// save_folder ``url`` (one rank per node) and return its path."""
    dest = Path(staging) / "downloads"
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        uploads.RemoteCheckpoints(url).download_checkpoint(name, dest)
    dist.barrier()
    return str(dest / name)


def remote_staging(path: str, upload_cfg=None) -> Path:
    """The local folder for files of the URL ``path``: checkpoint_upload.staging_folder when set."""
    return objectstore.staging_root(path, upload_cfg.staging_folder if upload_cfg is not None else None)


def resolve_load_path(path: str, staging: Path) -> str:
    """A local checkpoint path for ``load_path`` (an s3:// checkpoint or save_folder is downloaded first; so is a
    Composer checkpoint: a ``*.pt`` file or a sharded folder)."""
    if not objectstore.is_remote(path):
        return path
    found: tuple[str, str] | str | None = None
    if dist.rank() == 0:
        try:
            composer = _remote_composer_checkpoint(path.rstrip("/"))
            if composer is not None and composer[1].endswith(".pt") and not objectstore.ObjectFolder(
                    composer[0], "load_path", stores=objectstore.SOURCES).exists(composer[1]):
                found = str(objectstore.explain(FileNotFoundError(path), path, "load_path"))
            elif composer is not None:
                found = composer
            else:
                folder, name = uploads.resolve_remote(path)
                found = (folder.url, name)
        except ConfigError as error:
            found = str(error)
        except Exception as error:  # noqa: BLE001 - boto's errors: no such bucket, unreachable endpoint, ...
            found = str(objectstore.explain(error, path, "load_path"))
    found = dist.broadcast_object(found)
    if isinstance(found, str):
        raise ConfigError(found)
    if found[1].endswith(".pt"):  # one Composer monolithic file
        dest = Path(staging) / "downloads" / found[1]
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            dest.parent.mkdir(parents=True, exist_ok=True)
            objectstore.download_file(objectstore.join(found[0], found[1]), dest, objectstore.SOURCES)
        dist.barrier()
        return str(dest)
    return fetch(found[0], found[1], staging)


def _remote_composer_checkpoint(url: str, pointers_only: bool = False) -> tuple[str, str] | None:
    """(folder URL, name) of a Composer checkpoint at ``url``: a ``*.pt`` object, a sharded checkpoint folder (a
    ``.metadata`` without our ``rank0.pt``), or a save_folder with Composer's uploaded ``latest-*.symlink`` pointer
    (whose text is the target's key in the bucket). None when ``url`` is none of these."""
    parent, _, last = url.rpartition("/")
    if last.endswith(".pt") and not parent.endswith(":/") and not pointers_only:
        return parent, last
    folder = objectstore.ObjectFolder(url, "load_path", stores=objectstore.SOURCES)
    if (not pointers_only and folder.exists(".metadata") and not folder.exists("rank0.pt")
            and not parent.endswith(":/")):
        return parent, last
    for pointer in ("latest-sharded-rank0.symlink", "latest-rank0.pt.symlink"):
        target = folder.read_text(pointer)
        if target:
            target_url = f"{'/'.join(url.split('/', 3)[:3])}/{target.strip().lstrip('/')}"  # scheme://bucket[@ns]
            return target_url.rstrip("/").rpartition("/")[::2]
    return None


def stage_model_path(path: str, key: str = "load_path") -> str:
    """A local path for a model path: ``path`` itself unless it is a URL (any SOURCES store, hf:// too), in which
    case one of our checkpoints (or a save_folder's newest complete one), or a Hugging Face folder (recognised by
    its ``config.json``), is downloaded into the staging folder and the local copy's path returned. Used by
    llmfoundry.loading."""
    if not objectstore.is_remote(path):
        return path
    objectstore.check_url(path, key, objectstore.SOURCES)  # convert, eval, generate: every store, hf:// too
    staging = remote_staging(path)
    try:
        url = path.rstrip("/")
        parent, _, last = url.rpartition("/")
        if not parent.endswith(":/") and uploads.RemoteCheckpoints(url, key).exists("config.json"):  # a Hugging Face folder
            return fetch(parent, last, staging)
        return resolve_load_path(url, staging)
    except ConfigError as error:  # resolve_load_path names load_path; say which key it really was
        raise error.rekeyed("load_path", key) from None
    except Exception as error:  # noqa: BLE001 - botocore: no credentials, no endpoint, access denied, ...
        raise objectstore.explain(error, path, key) from None
