"""Checkpoints in S3 (a moto server on 127.0.0.1): background upload, completion marker, retention, resume, outage."""

from __future__ import annotations

import os
import socket
import threading
import time

import boto3
import pytest
import torch

from llmfoundry.core.errors import ConfigError
from llmfoundry.train import uploads
from llmfoundry.train.callbacks.base import Callback
from tests.helpers import S3_TEST_BUCKET as BUCKET
from tests.helpers import make_trainer, weights

pytestmark = pytest.mark.s3


def keys(prefix: str) -> list[str]:
    s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"])
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


def test_s3_save_folder_keeps_the_newest_and_autoresumes_exactly(recipe, s3_server, tmp_path):
    url = f"s3://{BUCKET}/runs/a"
    upload = {"staging_folder": str(tmp_path / "staging")}
    # A constant learning rate, so that 6 batches + 2 resumed ones equal 8 straight ones.
    recipe_ = recipe

    def recipe(**kw):
        return recipe_(scheduler=None, **kw)

    make_trainer(recipe(eval_loader=None, max_duration="6ba", save_folder=url, save_interval="2ba",
                        save_num_checkpoints_to_keep=2, checkpoint_upload=upload)).fit()
    folder = uploads.RemoteCheckpoints(url)
    assert folder.complete_checkpoints() == ["ep0-ba4", "ep0-ba6"]
    assert folder.read_text("latest").strip() == "ep0-ba6"
    assert not keys("runs/a/ep0-ba2/")  # retention deleted it
    assert {"runs/a/ep0-ba6/.metadata", "runs/a/ep0-ba6/rank0.pt", "runs/a/ep0-ba6/config.yaml",
            "runs/a/ep0-ba6/.complete"} <= set(keys("runs/a/ep0-ba6/"))
    assert not (tmp_path / "staging" / "ep0-ba6").exists()  # staged files go once uploaded

    resumed = make_trainer(recipe(eval_loader=None, max_duration="8ba", save_folder=url, save_interval="2ba",
                                  autoresume=True, checkpoint_upload={"staging_folder": str(tmp_path / "other")}))
    assert resumed.time.batch == 6
    resumed.fit()
    straight = make_trainer(recipe(eval_loader=None, max_duration="8ba"))
    straight.fit()
    expected, got = weights(straight), weights(resumed)
    for key in expected:
        assert torch.equal(expected[key], got[key]), key
    # load_path from S3: a save_folder (its latest) or one checkpoint
    for load_path in (url, f"{url}/ep0-ba6"):
        loaded = make_trainer(recipe(eval_loader=None, max_duration="8ba", load_path=load_path))
        assert loaded.time.batch == (8 if load_path == url else 6)


class Outage(Callback):
    """Stops the S3 server right after the ``at_save``-th checkpoint is handed to the uploader (in the background:
    training goes on) or, with ``after_batch``, at the end of that batch once every earlier upload has finished (so
    exactly the later checkpoints meet the dead store, however slow the machine). It restarts the server ``seconds``
    after stopping it, or (``seconds=None``) when the test calls ``restart()``. ``uploads`` (with ``after_batch``) is
    the trainer's checkpoint uploader."""

    def __init__(self, server, seconds: float | None, at_save: int = 1, after_batch: int | None = None, uploads=None):
        self.server, self.seconds, self.at_save, self.after_batch = server, seconds, at_save, after_batch
        self.uploads = uploads
        self.stopped_at = self.restarted_at = None
        self.batch_times: dict[int, float] = {}
        self.saves = 0

    def on_checkpoint_saved(self, state, path):
        self.saves += 1
        if self.after_batch is None and self.stopped_at is None and self.saves == self.at_save:
            self.stopped_at = time.monotonic()
            threading.Thread(target=self.server.stop).start()  # stopping takes a moment; training goes on
            self._restart_later()

    def on_batch_end(self, state, metrics):
        self.batch_times[state.time.batch] = time.monotonic()
        if state.time.batch == self.after_batch:
            assert self.uploads.wait(60), "an earlier upload did not finish before the outage"
            self.server.stop()
            self.stopped_at = time.monotonic()
            self._restart_later()

    def _restart_later(self):
        if self.seconds is not None:
            threading.Timer(self.seconds, self.restart).start()

    def restart(self):
        # noted before the server answers: an upload that then completes ends after restarted_at
        self.restarted_at = time.monotonic()
        self.server.start()


@pytest.mark.parametrize("outage_s", [float(os.environ.get("LLMFOUNDRY_TEST_S3_OUTAGE_S", "3")),
                                      pytest.param(10.0, marks=pytest.mark.slow)])
def test_upload_survives_an_s3_outage_without_a_premature_latest(recipe, s3_server, moto_s3, tmp_path, outage_s):
    url = f"s3://{BUCKET}/runs/outage"
    trainer = make_trainer(recipe(eval_loader=None, max_duration="10ba", save_folder=url, save_interval="2ba",
                                  checkpoint_upload={"staging_folder": str(tmp_path / "staging"),
                                                     "max_backoff_s": 1.0, "timeout_s": 600}))
    outage = Outage(moto_s3, outage_s)
    trainer.callbacks.append(outage)
    trainer.fit()
    ended = time.monotonic()
    assert outage.restarted_at is not None, "fit() returned before the server came back"

    # Training kept running (and saving: batch 4 is a save) while the server was down.
    during = [b for b, t in outage.batch_times.items() if outage.stopped_at <= t < outage.restarted_at]
    assert during[:2] == [3, 4], (outage.stopped_at, outage.restarted_at, outage.batch_times)
    if outage_s >= 10:  # the store is down for the rest of training (8 batches of a tiny model: ~2 s)
        assert during == list(range(3, 11))
    # ... and fit() waited for the uploads, which completed once the server was back.
    assert ended >= outage.restarted_at
    assert trainer.checkpointer.uploader.retries > 0
    folder = uploads.RemoteCheckpoints(url)
    names = [f"ep0-ba{b}" for b in (2, 4, 6, 8, 10)]
    assert folder.complete_checkpoints() == names  # none lost
    assert folder.read_text("latest").strip() == "ep0-ba10"
    for name in names:  # each complete checkpoint has every file
        got = {k.rsplit("/", 1)[1] for k in keys(f"runs/outage/{name}/") if "/tokenizer/" not in k}
        assert {".metadata", "__0_0.distcp", "rank0.pt", "config.yaml", ".complete"} <= got, name


class WriterUploads:
    """The uploads of save_async's writer process, waited for as an Uploader's are."""

    def __init__(self, checkpointer):
        self.checkpointer = checkpointer

    def wait(self, timeout_s: float) -> bool:
        self.checkpointer.wait()  # the write first: its upload starts once it is staged
        return self.checkpointer.background.upload_status(wait_s=timeout_s)["pending"] == 0


@pytest.mark.parametrize("save_async", [False, True], ids=["sync", "save_async"])
def test_an_outage_longer_than_the_upload_budget_is_a_one_line_error_and_the_run_resumes(recipe, s3_server, moto_s3,
                                                                                          tmp_path, save_async,
                                                                                          monkeypatch):
    from llmfoundry.train.errors import TrainingStopped

    url = f"s3://{BUCKET}/runs/long-outage"

    def run(**extra):
        return make_trainer(recipe(eval_loader=None, scheduler=None, max_duration="6ba", save_folder=url,
                                   save_interval="2ba", save_async=save_async, checkpoint_upload={
                                       "staging_folder": str(tmp_path / "staging"), "max_backoff_s": 0.5,
                                       "timeout_s": 2}, **extra))

    if save_async:  # the writer process uploads: an upload from a thread of this process would fail
        def not_here(*args, **kwargs):
            raise AssertionError("save_async uploaded from the training process")

        monkeypatch.setattr(uploads.Uploader, "submit", not_here)
    trainer = run()
    # ep0-ba2 is up; ep0-ba4 and ep0-ba6 meet a dead store
    outage = Outage(moto_s3, None, after_batch=3, uploads=WriterUploads(trainer.checkpointer) if save_async
                    else trainer.checkpointer.uploader)
    trainer.callbacks.append(outage)
    try:
        with pytest.raises(TrainingStopped) as caught:
            trainer.fit()
    finally:
        outage.restart()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"save_folder: checkpoint upload to {url} did not complete (ep0-ba4, ep0-ba6; "
                              "checkpoint_upload.timeout_s: 2 s)")
    folder = uploads.RemoteCheckpoints(url)
    assert folder.complete_checkpoints() == ["ep0-ba2"]
    assert folder.read_text("latest").strip() == "ep0-ba2"
    resumed = run(autoresume=True)
    assert resumed.time.batch == 2
    resumed.fit()
    straight = make_trainer(recipe(eval_loader=None, scheduler=None, max_duration="6ba"))
    straight.fit()
    expected, got = weights(straight), weights(resumed)
    for key in expected:
        assert torch.equal(expected[key], got[key]), key


class Wedge(Callback):
    """Makes the store stop answering (``TcpProxy.hold``) at the end of batch ``after_batch``, once every earlier
    upload is done; ``at``: when."""

    def __init__(self, proxy, after_batch: int, uploads):
        self.proxy, self.after_batch, self.uploads, self.at = proxy, after_batch, uploads, None

    def on_batch_end(self, state, metrics):
        if state.time.batch == self.after_batch:
            assert self.uploads.wait(60)
            self.proxy.hold()
            self.at = time.monotonic()


def test_save_async_uploads_still_pending_after_wait_at_end_s_are_cut_off(recipe, s3_server, moto_s3, tmp_path,
                                                                        monkeypatch):
    """A store that stops answering mid-run (connections accepted, nothing answered: each request waits for the
    client's 60 s read timeout, per attempt). save_async's writer uploads ep0-ba4; training ends; after
    checkpoint_upload.wait_at_end_s (1 s) the writer is stopped and, its uploads still pending, killed after
    async_save.CUT_OFF_S: fit ends with the one-line upload error well within a minute of the wedge. Before, the
    writer's exit waited for the object-store client's threads (up to STOP_TIMEOUT_S, 60 s, more). ep0-ba2 stays
    the latest checkpoint."""
    from llmfoundry.train.async_save import CUT_OFF_S
    from llmfoundry.train.errors import TrainingStopped
    from tests.tcp_proxy import TcpProxy

    proxy = TcpProxy("127.0.0.1", moto_s3.port).up()
    for name in ("S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.setenv(name, proxy.url)
    url = f"s3://{BUCKET}/runs/wedged"
    trainer = make_trainer(recipe(eval_loader=None, scheduler=None, max_duration="4ba", save_folder=url,
                                  save_interval="2ba", save_async=True, checkpoint_upload={
                                      "staging_folder": str(tmp_path / "staging"), "wait_at_end_s": 1}))
    wedge = Wedge(proxy, after_batch=3, uploads=WriterUploads(trainer.checkpointer))
    trainer.callbacks.append(wedge)
    try:
        with pytest.raises(TrainingStopped) as caught:
            trainer.fit()
        ended_after = time.monotonic() - wedge.at
    finally:
        proxy.release()
        proxy.down()
    assert "\n" not in str(caught.value) and "did not complete (1 still uploading" in str(caught.value)
    assert ended_after < 1 + CUT_OFF_S + 20, ended_after  # the last batch, the write, the wait, the cut-off
    assert uploads.RemoteCheckpoints(url).read_text("latest").strip() == "ep0-ba2"


def test_an_incomplete_s3_checkpoint_is_never_latest(recipe, s3_server, tmp_path):
    url = f"s3://{BUCKET}/runs/partial"
    make_trainer(recipe(eval_loader=None, max_duration="2ba", save_folder=url, save_interval="2ba",
                        checkpoint_upload={"staging_folder": str(tmp_path / "s")})).fit()
    # A later checkpoint whose upload was cut short: files but no .complete marker.
    s3 = boto3.client("s3", endpoint_url=s3_server)
    s3.put_object(Bucket=BUCKET, Key="runs/partial/ep0-ba4/.metadata", Body=b"x")
    s3.put_object(Bucket=BUCKET, Key="runs/partial/latest", Body=b"ep0-ba4\n")  # even a wrong pointer is checked
    assert uploads.RemoteCheckpoints(url).latest() == "ep0-ba2"
    trainer = make_trainer(recipe(eval_loader=None, max_duration="3ba", save_folder=url, autoresume=True,
                                  save_interval="3ba", checkpoint_upload={"staging_folder": str(tmp_path / "t")}))
    assert trainer.time.batch == 2


def test_an_s3_save_folder_that_cannot_be_used_is_a_one_line_error_before_training(recipe, s3_server,
                                                                                    monkeypatch):
    with pytest.raises(ConfigError) as error:
        make_trainer(recipe(eval_loader=None, save_folder="s3://no-such-bucket/run"))
    assert "save_folder: bucket 'no-such-bucket' does not exist" in str(error.value)

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("S3_ENDPOINT_URL", closed)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", closed)
    with pytest.raises(ConfigError) as error:
        make_trainer(recipe(eval_loader=None, save_folder=f"s3://{BUCKET}/run"))
    message = str(error.value)
    assert message.startswith(f"save_folder: cannot reach 's3://{BUCKET}/run' at {closed}") and "\n" not in message


def test_markers_left_by_a_killed_upload_do_not_complete_a_new_save_early(s3_server, tmp_path):
    """A run killed while uploading ep0-ba2 left rank 1's marker behind; the retry of ep0-ba2 on 2 ranks must
    wait for rank 1's new upload, not take the old marker for it."""
    url = f"s3://{BUCKET}/runs/killed"
    s3 = boto3.client("s3", endpoint_url=s3_server)
    for stale in ("runs/killed/ep0-ba2/.uploaded/rank1", "runs/killed/ep0-ba2/.uploaded/0123456789ab/rank1"):
        s3.put_object(Bucket=BUCKET, Key=stale, Body=b"")
    staged = tmp_path / "ep0-ba2"
    staged.mkdir()
    (staged / ".metadata").write_bytes(b"m")
    (staged / "__0_0.distcp").write_bytes(b"rank 0's shard")
    uploader = uploads.Uploader(url, rank=0, timeout_s=3, initial_backoff_s=0.1, max_backoff_s=0.2)
    uploader.submit(uploads.UploadJob("ep0-ba2", staged, world_size=2, keep=-1, attempt="fedcba987654"))
    assert uploader.close(timeout_s=30)
    assert uploader.failed == ["ep0-ba2"]  # rank 1 never uploaded in this attempt: not complete
    assert "runs/killed/ep0-ba2/.complete" not in keys("runs/killed/")
    assert uploads.RemoteCheckpoints(url).latest() is None


def test_uploads_submitted_after_the_uploads_were_waited_for_mid_run_are_uploaded(s3_server, tmp_path):
    """A launcher's just-in-time save (Ray's preemption notice) waits for every upload and closes the uploader, and
    training goes on: a checkpoint saved after that must still be uploaded (its thread starts again)."""
    url = f"s3://{BUCKET}/runs/again"
    uploader = uploads.Uploader(url, rank=0, timeout_s=30, initial_backoff_s=0.1, max_backoff_s=0.2)
    for name in ("ep0-ba2", "ep0-ba4"):
        staged = tmp_path / name
        staged.mkdir()
        (staged / ".metadata").write_bytes(b"m")
        uploader.submit(uploads.UploadJob(name, staged, world_size=1, keep=-1, attempt=f"attempt{name[-1]}"))
        assert uploader.close(timeout_s=30)  # waits, then lets its thread end
    assert uploader.failed == [] and uploader.pending() == 0
    assert uploads.RemoteCheckpoints(url).complete_checkpoints() == ["ep0-ba2", "ep0-ba4"]


def test_a_just_in_time_save_is_complete_when_it_returns_and_later_saves_still_upload(recipe, s3_server, tmp_path):
    """A launcher's preemption notice (Ray's) at a batch that is due for an interval save: save_now saves it and
    waits for its upload, so it is complete before the node goes; training goes on, and later saves upload too."""
    url = f"s3://{BUCKET}/runs/just-in-time"

    class Notice(Callback):
        complete = None

        def on_batch_end(self, state, metrics):
            if state.time.batch == 4:
                state.save_now()
                self.complete = uploads.RemoteCheckpoints(url).complete_checkpoints()

    trainer = make_trainer(recipe(eval_loader=None, max_duration="6ba", save_folder=url, save_interval="2ba",
                                  checkpoint_upload={"staging_folder": str(tmp_path / "staging")}))
    notice = Notice()
    trainer.callbacks.append(notice)
    trainer.fit()
    assert notice.complete == ["ep0-ba2", "ep0-ba4"]
    assert uploads.RemoteCheckpoints(url).complete_checkpoints() == ["ep0-ba2", "ep0-ba4", "ep0-ba6"]
