"""Checkpoints in an object store (``s3://bucket/prefix``): background upload with retries, completion markers.

Layout under the save_folder prefix::

    s3://bucket/prefix/ep0-ba100/...            the files of one checkpoint (same as a local checkpoint folder)
    s3://bucket/prefix/ep0-ba100/.uploaded/{attempt}/rank{r}   rank r has uploaded every file it wrote
    s3://bucket/prefix/ep0-ba100/.complete      uploaded last, by rank 0, once every rank's marker is there
    s3://bucket/prefix/latest                   the name of the newest complete checkpoint (written after .complete)

Every rank writes its part of a checkpoint into a local staging folder and hands the folder to its
:class:`Uploader`, a background thread that uploads the files this rank wrote (its DCP shard and ``rank{r}.pt``;
rank 0 also the metadata, config and tokenizer). A failed request is retried with exponential backoff until the
upload's deadline, so training continues while the store is unreachable. A checkpoint without ``.complete`` is
never loaded and never named by ``latest``. The per-rank markers sit under an id of the save attempt, so the
markers a killed run left behind cannot make a later save of the same checkpoint name look finished early.
Hugging Face exports (hf_checkpointer, ``llmfoundry convert``) are written by one process and use
:func:`publish_folder`: the same ``.complete`` marker, uploaded last, without per-rank markers or ``latest``.
The store itself (client, retries, listing) is llmfoundry.core.objectstore.
"""

from __future__ import annotations

import logging
import queue
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.train.checkpoint import CHECKPOINT_NAME, LATEST
from llmfoundry.train.checkpoint_files import owned_files

log = logging.getLogger(__name__)

COMPLETE = ".complete"
UPLOADED = ".uploaded"
METADATA = ".metadata"  # DCP's, in every checkpoint


class RemoteCheckpoints(objectstore.ObjectFolder):
    """A save_folder in an object store (or a Hub repo, read-only): list complete checkpoints, find the latest,
    download or delete one."""

    def __init__(self, url: str, key: str = "path", *, max_attempts: int = 1):
        super().__init__(url, key, max_attempts=max_attempts, stores=objectstore.SOURCES)
        # A Hub repo changes by commits, each one whole or not at all (``hf upload`` of a local save_folder, whose
        # checkpoints have no upload markers): there a checkpoint is complete once it has .metadata, as on disk.
        self.marker = METADATA if self.url.startswith(objectstore.HF) else COMPLETE

    def complete_checkpoints(self) -> list[str]:
        """Names of complete checkpoints, oldest first."""
        found = []
        base = self.key()
        for key in self.list_keys():
            rest = key[len(base) + 1:] if base else key
            parts = rest.split("/")
            if len(parts) == 2 and parts[1] == self.marker and (m := CHECKPOINT_NAME.match(parts[0])):
                found.append((int(m.group(2)), parts[0]))
        return [name for _, name in sorted(found)]

    def latest(self) -> str | None:
        """The newest complete checkpoint: the one ``latest`` names if it is complete, else the newest listed."""
        name = (self.read_text(LATEST) or "").strip()
        if name and self.exists(name, self.marker):
            return name
        complete = self.complete_checkpoints()
        return complete[-1] if complete else None

    def download_checkpoint(self, name: str, dest: Path) -> Path:
        """Copy checkpoint ``name`` (without its upload markers) into a fresh ``dest/name``."""
        return self.download(name, dest, skip=lambda rel: rel == COMPLETE or rel.startswith(UPLOADED + "/"))

    def delete_checkpoint(self, name: str) -> None:
        keys = self.list_keys(name)
        # The marker goes first, in a request of its own (a batch's keys go in no set order), so a half-deleted
        # checkpoint is never taken for a complete one.
        marker = [k for k in keys if k.endswith("/" + COMPLETE)]
        self.delete(marker)
        self.delete([k for k in keys if k not in marker])


def resolve_remote(url: str, key: str = "load_path") -> tuple[RemoteCheckpoints, str]:
    """(folder, checkpoint name) for a remote checkpoint or save_folder (whose newest complete one is used)."""
    url = url.rstrip("/")
    parent, _, last = url.rpartition("/")
    if CHECKPOINT_NAME.match(last) and not parent.endswith(":/"):
        folder = RemoteCheckpoints(parent, key)
        if folder.exists(last, folder.marker):
            return folder, last
        raise ConfigError(f"{key}: '{url}' is not a complete checkpoint (no {folder.marker} marker)")
    folder = RemoteCheckpoints(url, key)
    name = folder.latest()
    if name is None:
        raise ConfigError(f"{key}: '{url}' holds no complete checkpoint")
    return folder, name


# ----------------------------------------------------------------------------------------------- writing
@dataclass
class UploadJob:
    name: str
    staged: Path
    world_size: int
    keep: int  # save_num_checkpoints_to_keep (<= 0 = all)
    attempt: str  # the same on every rank for one save; names the folder of this save's .uploaded markers


class Uploader:
    """This rank's background uploads of staged checkpoints to ``url``, one at a time and in order."""

    def __init__(self, url: str, rank: int, *, timeout_s: float = 3600.0, initial_backoff_s: float = 0.5,
                 max_backoff_s: float = 8.0):
        self.url = url
        self.rank = rank
        self.timeout_s = timeout_s
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self.folder = RemoteCheckpoints(url, max_attempts=objectstore.UPLOAD_REQUEST_RETRIES)
        self.jobs: queue.Queue[UploadJob | None] = queue.Queue()
        self.completed: list[str] = []  # checkpoints this rank finished uploading (rank 0: marked complete)
        self.failed: list[str] = []
        self.retries = 0  # failed requests (botocore's retries of a part included) and files started again
        self._counting = threading.Lock()  # s3transfer's threads count too
        objectstore.count_failed_requests(self.folder.client, self._count_retry)
        # Started by the first upload: a run that stops before its first save (a bad recipe found late, a missing
        # bucket) leaves no thread behind. Started again by an upload after close() (a launcher's just-in-time
        # save waits for the uploads mid-run, and training goes on).
        self._thread: threading.Thread | None = None
        self._starting = threading.Lock()  # the thread's decision to end, against a submit that needs it
        self._stops = 0  # close()'s stop marks in the queue, not yet taken (not uploads: pending() leaves them out)

    def submit(self, job: UploadJob) -> None:
        with self._starting:
            self.jobs.put(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"checkpoint-upload-rank{self.rank}",
                                                daemon=True)
                self._thread.start()

    def pending(self) -> int:
        """Checkpoints submitted and not yet uploaded (or failed)."""
        with self._starting:
            return self.jobs.unfinished_tasks - self._stops

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until every submitted upload has finished (or failed); False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.pending():
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def close(self, timeout_s: float | None = None) -> bool:
        """Wait up to ``timeout_s`` for the uploads, then let the thread end once none is left (a later submit
        starts it again); False if some were still running."""
        done = self.wait(timeout_s)
        with self._starting:
            if self._thread is not None:
                self._stops += 1
                self.jobs.put(None)
        return done

    # -- the thread --
    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                with self._starting:
                    self._stops -= 1
                    self.jobs.task_done()
                    if self.jobs.empty():  # nothing submitted after close(): end (a later submit starts anew)
                        self._thread = None
                        return
                continue
            try:
                self._upload(job)
                self.completed.append(job.name)
            except Exception as error:  # noqa: BLE001 - a lost upload must not kill training
                self.failed.append(job.name)
                log.error("checkpoint %s: upload to %s failed, it will not be marked complete (%s)",
                          job.name, self.url, error)
            finally:
                self.jobs.task_done()

    def _count_retry(self) -> None:
        with self._counting:
            self.retries += 1

    def _retry(self, deadline: float) -> objectstore.Retry:
        def on_retry(error: Exception, wait: float) -> None:
            self._count_retry()
            log.warning("checkpoint upload to %s: %s; retrying in %.1f s", self.url, type(error).__name__, wait)

        return objectstore.Retry(deadline, self.initial_backoff_s, self.max_backoff_s, on_retry)

    def _upload(self, job: UploadJob) -> None:
        deadline = time.monotonic() + self.timeout_s
        retry = self._retry(deadline)
        s3, bucket = self.folder.client, self.folder.bucket
        files = owned_files(job.staged, self.rank)
        for path in files:
            key = self.folder.key(job.name, path.relative_to(job.staged).as_posix())
            retry.call(lambda: s3.upload_file(str(path), bucket, key))
        marker = self.folder.key(job.name, UPLOADED, job.attempt, f"rank{self.rank}")
        retry.call(lambda: s3.put_object(Bucket=bucket, Key=marker, Body=b""))
        for path in files:
            if self.rank != 0:
                path.unlink(missing_ok=True)
        if self.rank != 0:
            return
        # Rank 0 finishes the checkpoint once every rank's files are up: .complete first, then latest.
        expected = {f"rank{r}" for r in range(job.world_size)}
        wait = self.initial_backoff_s
        while True:
            done = retry.call(lambda: {k.rsplit("/", 1)[1]
                                       for k in self.folder.list_keys(job.name, UPLOADED, job.attempt)})
            if expected <= done:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks {sorted(expected - done)} did not finish uploading")
            time.sleep(wait)
            wait = min(self.max_backoff_s, wait * 2)
        retry.call(lambda: s3.put_object(Bucket=bucket, Key=self.folder.key(job.name, COMPLETE), Body=b""))
        retry.call(lambda: s3.put_object(Bucket=bucket, Key=self.folder.key(LATEST), Body=(job.name + "\n").encode()))
        if job.keep > 0:
            for old in retry.call(self.folder.complete_checkpoints)[:-job.keep]:
                retry.call(lambda old=old: self.folder.delete_checkpoint(old))
        shutil.rmtree(job.staged, ignore_errors=True)


# ----------------------------------------------------------------------------------------------- whole folders
def publish_folder(staged: Path, url: str, retry: objectstore.Retry, *, last: tuple[str, ...] = ()) -> list[str]:
    """Upload the local folder ``staged`` to ``url`` (a prefix in any CHECKPOINT_STORES store) from one process, so that no reader takes
    a partial copy for a complete one: the :data:`COMPLETE` marker goes up last, and the relative paths in
    ``last`` (e.g. a Hugging Face folder's ``config.json``, by which loaders recognise one) just before it. An
    earlier copy under ``url`` is replaced: its marker and ``last`` files are deleted first, its other stale files
    once the new ones are up. Used for Hugging Face exports (hf_checkpointer, ``llmfoundry convert``); returns the
    relative paths uploaded."""
    folder = objectstore.ObjectFolder(url, max_attempts=objectstore.UPLOAD_REQUEST_RETRIES,
                                      stores=objectstore.CHECKPOINT_STORES)
    s3, bucket = folder.client, folder.bucket

    def delete(key: str) -> None:
        retry.call(lambda: s3.delete_object(Bucket=bucket, Key=key))

    def upload(rel: str) -> None:
        retry.call(lambda: s3.upload_file(str(staged / rel), bucket, folder.key(rel)))

    files = sorted(p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file())
    finishing = [rel for rel in last if rel in files]
    old = set(retry.call(folder.list_keys))
    for key in sorted(old & {folder.key(rel) for rel in (COMPLETE, *last)}):  # the old copy stops looking complete
        delete(key)
    for rel in files:
        if rel not in finishing:
            upload(rel)
    for key in sorted(old - {folder.key(rel) for rel in (COMPLETE, *last, *files)}):  # stale files of the old copy
        delete(key)
    for rel in finishing:
        upload(rel)
    retry.call(lambda: s3.put_object(Bucket=bucket, Key=folder.key(COMPLETE), Body=b""))
    return files


def describe(pending: int, retries: int) -> dict[str, Any]:
    """The metrics of a rank's uploads: checkpoints still uploading, and requests retried so far."""
    return {"checkpoint/uploads_pending": float(pending), "checkpoint/upload_retries": float(retries)}
