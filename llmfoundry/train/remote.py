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
"""

from __future__ import annotations

import logging
import os
import queue
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from llmfoundry.config.errors import ConfigError, first_line

log = logging.getLogger(__name__)

COMPLETE = ".complete"
UPLOADED = ".uploaded"
LATEST = "latest"
_NAME = re.compile(r"^ep(\d+)-ba(\d+)$")
T = TypeVar("T")


def is_remote(path: str | os.PathLike | None) -> bool:
    return isinstance(path, str) and path.startswith("s3://")


def split_url(url: str) -> tuple[str, str]:
    """``s3://bucket/a/b/`` -> (``bucket``, ``a/b``)."""
    if not is_remote(url):
        raise ConfigError(f"save_folder: '{url}' is not an s3:// URL")
    bucket, _, key = url[len("s3://"):].partition("/")
    if not bucket:
        raise ConfigError(f"save_folder: '{url}' has no bucket (use s3://bucket/path)")
    return bucket, key.strip("/")


def _join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p.strip("/"))


def client():
    """An S3 client (endpoint from S3_ENDPOINT_URL for S3-compatible stores); retries are ours, not botocore's."""
    import boto3
    from botocore.config import Config

    config = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=5, read_timeout=60)
    endpoint = os.environ.get("S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3") or None
    return boto3.session.Session().client("s3", endpoint_url=endpoint, config=config)


def _error_code(error: Exception) -> str:
    return str(getattr(error, "response", {}).get("Error", {}).get("Code", ""))


def _is_missing(error: Exception) -> bool:
    return _error_code(error) in ("404", "NoSuchKey", "NotFound", "NoSuchBucket")


def explain(error: Exception, url: str, key: str) -> ConfigError:
    """A one-line ConfigError for an object-store error met while setting up (not while uploading)."""
    code = _error_code(error)
    bucket = split_url(url)[0]
    endpoint = os.environ.get("S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3") or "AWS S3"
    if code == "NoSuchBucket":
        return ConfigError(f"{key}: bucket '{bucket}' does not exist at {endpoint} (create it, or check the name "
                           "and S3_ENDPOINT_URL)")
    if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        return ConfigError(f"{key}: access to '{url}' was refused ({code}); check AWS_ACCESS_KEY_ID / "
                           "AWS_SECRET_ACCESS_KEY and the bucket's permissions")
    return ConfigError(f"{key}: cannot reach '{url}' at {endpoint} ({first_line(error)}); check S3_ENDPOINT_URL and the "
                       "network")


@dataclass
class Retry:
    """Exponential backoff until a deadline: ``Retry(...).call(fn)`` returns fn()'s result or raises the last error."""

    deadline: float  # time.monotonic() value
    initial_s: float = 0.5
    max_s: float = 8.0
    on_retry: Callable[[Exception, float], None] | None = None

    def call(self, fn: Callable[[], T]) -> T:
        wait = self.initial_s
        while True:
            try:
                return fn()
            except Exception as error:  # noqa: BLE001 - network errors come in many types
                if _is_missing(error) or time.monotonic() + wait > self.deadline:
                    raise
                if self.on_retry is not None:
                    self.on_retry(error, wait)
                time.sleep(wait)
                wait = min(self.max_s, wait * 2)


# ----------------------------------------------------------------------------------------------- reading
class RemoteFolder:
    """A save_folder in S3: list complete checkpoints, find the latest, download one."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.bucket, self.prefix = split_url(url)
        self.s3 = client()

    def key(self, *parts: str) -> str:
        return _join(self.prefix, *parts)

    def exists(self, *parts: str) -> bool:
        try:
            self.s3.head_object(Bucket=self.bucket, Key=self.key(*parts))
            return True
        except Exception as error:  # noqa: BLE001
            if _is_missing(error):
                return False
            raise

    def read_text(self, *parts: str) -> str | None:
        try:
            return self.s3.get_object(Bucket=self.bucket, Key=self.key(*parts))["Body"].read().decode()
        except Exception as error:  # noqa: BLE001
            if _is_missing(error):
                return None
            raise

    def list_keys(self, *parts: str) -> list[str]:
        prefix = self.key(*parts)
        prefix = prefix + "/" if prefix else ""
        keys = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            keys += [item["Key"] for item in page.get("Contents", [])]
        return keys

    def complete_checkpoints(self) -> list[str]:
        """Names of complete checkpoints, oldest first."""
        found = []
        for key in self.list_keys():
            rest = key[len(self.key()) + 1:] if self.prefix else key
            parts = rest.split("/")
            if len(parts) == 2 and parts[1] == COMPLETE and (m := _NAME.match(parts[0])):
                found.append((int(m.group(2)), parts[0]))
        return [name for _, name in sorted(found)]

    def latest(self) -> str | None:
        """The newest complete checkpoint: the one ``latest`` names if it is complete, else the newest listed."""
        name = (self.read_text(LATEST) or "").strip()
        if name and self.exists(name, COMPLETE):
            return name
        complete = self.complete_checkpoints()
        return complete[-1] if complete else None

    def download(self, name: str, dest: Path) -> Path:
        """Copy checkpoint ``name`` into a fresh ``dest/name``; returns that folder."""
        target = dest / name
        shutil.rmtree(target, ignore_errors=True)
        for key in self.list_keys(name):
            rel = key[len(self.key(name)) + 1:]
            if rel == COMPLETE or rel.startswith(UPLOADED + "/"):
                continue
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            self.s3.download_file(self.bucket, key, str(tmp))
            os.replace(tmp, path)
        return target

    def delete(self, name: str) -> None:
        keys = self.list_keys(name)
        # The marker goes first, so a half-deleted checkpoint is never taken for a complete one.
        keys.sort(key=lambda k: not k.endswith("/" + COMPLETE))
        for key in keys:
            self.s3.delete_object(Bucket=self.bucket, Key=key)


def resolve_remote(url: str, key: str = "load_path") -> tuple[RemoteFolder, str]:
    """(folder, checkpoint name) for an s3:// checkpoint or save_folder (whose newest complete one is used)."""
    url = url.rstrip("/")
    parent, _, last = url.rpartition("/")
    if _NAME.match(last) and parent != "s3:/":
        folder = RemoteFolder(parent)
        if folder.exists(last, COMPLETE):
            return folder, last
        raise ConfigError(f"{key}: '{url}' is not a complete checkpoint (no {COMPLETE} marker)")
    folder = RemoteFolder(url)
    name = folder.latest()
    if name is None:
        raise ConfigError(f"{key}: '{url}' holds no complete checkpoint")
    return folder, name


# ----------------------------------------------------------------------------------------------- writing
def owned_files(folder: Path, rank: int) -> list[Path]:
    """The files of a staged checkpoint that ``rank`` wrote and uploads (rank 0: everything not per-rank)."""
    owned = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        shard = re.match(r"^__(\d+)_\d+\.distcp$", rel)
        per_rank = re.match(r"^rank(\d+)\.pt$", rel)
        if shard or per_rank:
            if int((shard or per_rank).group(1)) == rank:
                owned.append(path)
        elif rank == 0:
            owned.append(path)
    return owned


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
        self.folder = RemoteFolder(url)
        self.jobs: queue.Queue[UploadJob | None] = queue.Queue()
        self.completed: list[str] = []  # checkpoints this rank finished uploading (rank 0: marked complete)
        self.failed: list[str] = []
        self.retries = 0
        self._thread = threading.Thread(target=self._run, name=f"checkpoint-upload-rank{rank}", daemon=True)
        self._thread.start()

    def submit(self, job: UploadJob) -> None:
        self.jobs.put(job)

    def pending(self) -> int:
        return self.jobs.unfinished_tasks

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until every submitted upload has finished (or failed); False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.jobs.unfinished_tasks:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def close(self, timeout_s: float | None = None) -> bool:
        done = self.wait(timeout_s)
        self.jobs.put(None)
        return done

    # -- the thread --
    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            try:
                if job is None:
                    return
                self._upload(job)
                self.completed.append(job.name)
            except Exception as error:  # noqa: BLE001 - a lost upload must not kill training
                self.failed.append(job.name)
                log.error("checkpoint %s: upload to %s failed, it will not be marked complete (%s)",
                          job.name, self.url, error)
            finally:
                self.jobs.task_done()

    def _retry(self, deadline: float) -> Retry:
        def on_retry(error: Exception, wait: float) -> None:
            self.retries += 1
            log.warning("checkpoint upload to %s: %s; retrying in %.1f s", self.url, type(error).__name__, wait)

        return Retry(deadline, self.initial_backoff_s, self.max_backoff_s, on_retry)

    def _upload(self, job: UploadJob) -> None:
        deadline = time.monotonic() + self.timeout_s
        retry = self._retry(deadline)
        s3, bucket = self.folder.s3, self.folder.bucket
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
                retry.call(lambda old=old: self.folder.delete(old))
        shutil.rmtree(job.staged, ignore_errors=True)


def staging_root(url: str, configured: str | None) -> Path:
    """The local folder where checkpoints for ``url`` are staged before upload."""
    if configured:
        return Path(configured)
    import hashlib
    import tempfile

    digest = hashlib.sha1(url.encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / "llmfoundry-staging" / digest


def describe(uploader: Uploader | None) -> dict[str, Any]:
    if uploader is None:
        return {}
    return {"checkpoint/uploads_pending": float(uploader.pending()), "checkpoint/upload_retries": float(uploader.retries)}
