"""save_async: checkpoints written in the background hold the state of their step, resume bitwise, and their
failures are raised, never lost. The write runs in a process of its own, stopped and reaped at the end."""

from __future__ import annotations

import os
import signal
import threading

import pytest
import torch

from llmfoundry.core.errors import ConfigError
from llmfoundry.train import uploads
from tests.helpers import S3_TEST_BUCKET, make_trainer, weights
from tests.distributed.helpers import checkpoint_weights


def test_async_checkpoints_equal_synchronous_ones_and_resume_bitwise(recipe, tmp_path):
    sync = make_trainer(recipe(eval_loader=None, save_folder=str(tmp_path / "sync"), save_interval="2ba"))
    sync.fit()
    background = make_trainer(recipe(eval_loader=None, save_folder=str(tmp_path / "async"), save_interval="2ba",
                                     save_async=True))
    background.fit()
    assert (tmp_path / "async" / "latest").read_text().strip() == "ep1-ba12"
    # Each checkpoint holds its own step's state, although training went on while it was written.
    for name in ("ep0-ba4", "ep1-ba12"):
        expected, got = checkpoint_weights(tmp_path / "sync" / name), checkpoint_weights(tmp_path / "async" / name)
        assert expected.keys() == got.keys()
        assert all(torch.equal(expected[k], got[k]) for k in expected), name
    resumed = make_trainer(recipe(eval_loader=None, load_path=str(tmp_path / "async" / "ep0-ba4"), save_async=True,
                                  save_folder=str(tmp_path / "resumed"), save_interval="3ba"))
    assert resumed.time.batch == 4
    resumed.fit()
    expected, got = weights(sync), weights(resumed)
    assert all(torch.equal(expected[k], got[k]) for k in expected)


@pytest.mark.parametrize("save_async", [False, True])
def test_a_failed_background_write_is_raised_as_the_synchronous_error(recipe, tmp_path, save_async):
    folder = tmp_path / "run"
    make_trainer(recipe(eval_loader=None, max_duration="4ba", save_folder=str(folder), save_interval="2ba")).fit()
    (folder / "latest").write_text("ep0-ba2\n")  # autoresume from ba2: the save at ba4 finds ep0-ba4 in its way
    trainer = make_trainer(recipe(eval_loader=None, max_duration="6ba", save_folder=str(folder), save_interval="2ba",
                                  autoresume=True, save_async=save_async))
    assert trainer.time.batch == 2
    with pytest.raises(ConfigError, match="checkpoint '.*ep0-ba4' already exists"):
        trainer.fit()  # async: raised by the next save (at batch 6), never lost
    assert trainer.time.batch == (6 if save_async else 4)
    assert not (folder / "ep0-ba6").exists()  # nothing is written after a failed save
    assert (folder / "latest").read_text().strip() == "ep0-ba2"


@pytest.mark.s3
def test_async_save_to_s3_marks_checkpoints_complete_and_resumes(recipe, s3_server, tmp_path):
    url = f"s3://{S3_TEST_BUCKET}/runs/async"
    common = dict(eval_loader=None, scheduler=None, save_folder=url, save_interval="2ba", save_async=True,
                  save_num_checkpoints_to_keep=2)
    make_trainer(recipe(max_duration="6ba", checkpoint_upload={"staging_folder": str(tmp_path / "a")},
                        **common)).fit()
    folder = uploads.RemoteCheckpoints(url)
    assert folder.complete_checkpoints() == ["ep0-ba4", "ep0-ba6"]
    assert folder.read_text("latest").strip() == "ep0-ba6"
    resumed = make_trainer(recipe(max_duration="8ba", autoresume=True,
                                  checkpoint_upload={"staging_folder": str(tmp_path / "b")}, **common))
    assert resumed.time.batch == 6
    resumed.fit()
    straight = make_trainer(recipe(eval_loader=None, scheduler=None, max_duration="8ba"))
    straight.fit()
    expected, got = weights(straight), weights(resumed)
    assert all(torch.equal(expected[k], got[k]) for k in expected)


@pytest.mark.s3
def test_step_metrics_ask_the_writer_about_uploads_only_while_some_are_pending(recipe, s3_server, tmp_path,
                                                                             monkeypatch):
    """The writer process uploads; a step's upload metrics ask it only after a save handed it an upload (before, the
    first step would wait for the writer to start), and the end of training waits for the uploads."""
    from llmfoundry.train import async_save

    asked, request = [], async_save.WriterProcess.request

    def counting(self, message, fd=None):
        if message.get("op") == "uploads":
            asked.append((trainer.time.batch, message["close"]))
        return request(self, message, fd)

    monkeypatch.setattr(async_save.WriterProcess, "request", counting)
    url = f"s3://{S3_TEST_BUCKET}/runs/asked"
    trainer = make_trainer(recipe(eval_loader=None, max_duration="6ba", save_folder=url, save_interval="4ba",
                                  save_async=True, checkpoint_upload={"staging_folder": str(tmp_path / "s")}))
    trainer.fit()
    assert asked and min(batch for batch, _ in asked) >= 4, asked  # nothing before the first save, at batch 4
    assert asked[-1] == (6, True)  # the end of training waited for the uploads, then closed the uploader
    assert uploads.RemoteCheckpoints(url).complete_checkpoints() == ["ep0-ba4", "ep0-ba6"]


def test_the_optimizer_step_after_a_save_waits_for_the_copy_of_the_state():
    from llmfoundry.train.async_save import AsyncSaver
    from llmfoundry.train.checkpoint import take_snapshot
    from llmfoundry.train.components import training_components

    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.BatchNorm1d(1024))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 1024)).sum().backward()
    optimizer.step()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    saver = AsyncSaver()
    copied = saver.snapshot(take_snapshot(training_components(model, optimizer)),
                            model, optimizer)
    model(torch.randn(4, 1024)).sum().backward()  # changes the BatchNorm buffers: copied before snapshot returned
    optimizer.step()  # changes the parameters and the optimizer state: waits for their copy first
    snapshot = copied()
    assert snapshot.state["model"].keys() == before.keys()
    assert all(torch.equal(snapshot.state["model"][k], before[k]) for k in before)
    assert not torch.equal(model[0].weight, before["0.weight"])
    assert int(snapshot.state["optimizer"]["state"]["0.weight"]["step"]) == 1
    writer = saver.writer.process
    saver.release()
    assert writer.returncode == 0  # stopped and reaped


def _background_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("checkpoint-")]


def test_async_saves_are_written_by_a_process_of_their_own_which_the_end_of_training_reaps(recipe, tmp_path,
                                                                                            monkeypatch):
    from llmfoundry.train import checkpoint

    def not_here(*args, **kwargs):
        raise AssertionError("save_async wrote a checkpoint in the training process")

    # a write in this process (the writer thread of before) fails; the writer process has its own, unpatched copy
    monkeypatch.setattr(checkpoint, "write_snapshot", not_here)
    trainer = make_trainer(recipe(eval_loader=None, max_duration="6ba", save_folder=str(tmp_path / "run"),
                                  save_interval="2ba", save_async=True))
    writer = trainer.checkpointer.background.writer.process
    assert writer.pid != os.getpid() and writer.poll() is None
    trainer.fit()
    assert (tmp_path / "run" / "latest").read_text().strip() == "ep0-ba6"
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path / "run")] == ["ep0-ba2", "ep0-ba4", "ep0-ba6"]
    assert writer.returncode == 0  # stopped and reaped by the end of training: no process left behind
    assert trainer.checkpointer.background.writer is None
    assert _background_threads() == []  # neither the copy thread nor the courier outlives training


@pytest.mark.parametrize("when", ["mid-write", "between writes"])
def test_a_killed_writer_process_is_a_one_line_error_at_the_next_save_and_leaves_latest_alone(recipe, tmp_path, when):
    folder = tmp_path / "run"
    trainer = make_trainer(recipe(eval_loader=None, max_duration="6ba", save_folder=str(folder), save_interval="2ba",
                                  save_async=True))
    save, killed = trainer.save, []

    def save_then_kill_the_writer():
        if trainer.time.batch == 4:  # ep0-ba2 is complete; the writer stops before ep0-ba4 and is killed
            trainer.checkpointer.wait()
            writer = trainer.checkpointer.background.writer.process
            killed.append(writer)
            if when == "between writes":  # dead before the request is sent: a broken pipe
                os.kill(writer.pid, signal.SIGKILL)
                writer.wait()
                return save()
            os.kill(writer.pid, signal.SIGSTOP)  # the request is sent; the answer never comes
            path = save()
            os.kill(writer.pid, signal.SIGKILL)
            return path
        return save()

    trainer.save = save_then_kill_the_writer
    with pytest.raises(ConfigError) as raised:
        trainer.fit()
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("save_folder: could not write checkpoint 'ep0-ba4' (the checkpoint writer process "
                              f"exited (code {-signal.SIGKILL}))"), message
    assert trainer.time.batch == 6  # raised by the next save, as a failed write always is
    assert killed[0].returncode == -signal.SIGKILL  # reaped
    assert (folder / "latest").read_text().strip() == "ep0-ba2"
    assert [p.name for p in checkpoint_list(folder)] == ["ep0-ba2"]  # at most a .partial folder of ep0-ba4
    assert trainer.checkpointer.background.writer is None  # stopped after the error
    assert _background_threads() == []


def checkpoint_list(folder):
    from llmfoundry.train.checkpoint import list_checkpoints

    return list_checkpoints(folder)

