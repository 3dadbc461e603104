"""A damaged checkpoint file (truncated, bit-flipped, missing) is a one-line error naming the file, before DCP reads
anything; an intact checkpoint, and one written before checksums existed, load as before."""

from __future__ import annotations

import shutil

import pytest
import torch

from llmfoundry.core.errors import ConfigError
from llmfoundry.train.checkpoint import load_checkpoint
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.checkpoint_files import CHECKSUMS, owned_files
from tests.helpers import make_trainer, tiny_recipe


@pytest.fixture(scope="module")
def saved(tmp_path_factory, mds_root, tokenizer_dir):
    folder = tmp_path_factory.mktemp("integrity")
    trainer = make_trainer(tiny_recipe(mds_root, tokenizer_dir, max_duration="2ba", save_interval="2ba",
                                       save_folder=str(folder / "ckpt"), eval_interval="2ba"))
    trainer.fit()
    return trainer, folder / "ckpt" / "ep0-ba2"


@pytest.fixture
def checkpoint(saved, tmp_path):
    trainer, original = saved
    copy = tmp_path / original.name
    shutil.copytree(original, copy)
    return trainer, copy


def test_every_file_of_a_checkpoint_has_a_recorded_checksum(checkpoint):
    _, folder = checkpoint
    listed = {p.relative_to(folder).as_posix() for p in owned_files(folder, 0)}
    assert {".metadata", "__0_0.distcp", "rank0.pt", "config.yaml", f"{CHECKSUMS}/rank0.json"} <= listed
    assert any(name.startswith("tokenizer/") for name in listed)


def test_an_intact_checkpoint_and_one_without_checksums_load(checkpoint):
    trainer, folder = checkpoint
    load_checkpoint(folder, trainer.checkpoint_components())
    shutil.rmtree(folder / CHECKSUMS)  # written before checksums existed
    load_checkpoint(folder, trainer.checkpoint_components())


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_a_damaged_shard_is_a_one_line_error_naming_it(checkpoint, damage):
    trainer, folder = checkpoint
    shard = folder / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    if damage == "truncate":
        shard.write_bytes(bytes(data[: len(data) // 2]))
    elif damage == "flip":
        data[len(data) // 2] ^= 0x10
        shard.write_bytes(bytes(data))
    else:
        shard.unlink()
    expected = {"truncate": "truncated", "flip": "does not match its checksum", "delete": "is missing"}[damage]
    with pytest.raises(ConfigError) as caught:
        load_checkpoint(folder, trainer.checkpoint_components())
    message = str(caught.value)
    assert "\n" not in message
    assert f"'{shard}'" in message and expected in message and "resume from an earlier checkpoint" in message


def test_a_checksum_list_naming_a_file_outside_the_checkpoint_is_refused(checkpoint):
    trainer, folder = checkpoint
    (folder / CHECKSUMS / "rank0.json").write_text('{"files": {"../../etc/passwd": {"size": 1, "xxh3_64": "0"}}}')
    with pytest.raises(ConfigError, match="outside the checkpoint"):
        load_checkpoint(folder, trainer.checkpoint_components())


class FileSizeLimit(Callback):
    """From batch ``at`` on, no file of this process may grow past ``limit`` bytes (RLIMIT_FSIZE): writes fail
    with EFBIG as on a full disk (Python ignores SIGXFSZ)."""

    def __init__(self, at: int, limit: int):
        import resource

        self.at, self.limit, self.resource = at, limit, resource
        self.previous = resource.getrlimit(resource.RLIMIT_FSIZE)

    def on_batch_start(self, trainer):
        if trainer.time.batch + 1 == self.at:
            self.resource.setrlimit(self.resource.RLIMIT_FSIZE, (self.limit, self.previous[1]))

    def restore(self):
        self.resource.setrlimit(self.resource.RLIMIT_FSIZE, self.previous)


def test_a_save_that_cannot_be_written_is_a_one_line_error_and_the_run_resumes_from_the_last_one(
        mds_root, tokenizer_dir, tmp_path):
    def recipe(**extra):
        extra.setdefault("save_folder", str(tmp_path / "ckpt"))
        return tiny_recipe(mds_root, tokenizer_dir, max_duration="4ba", save_interval="2ba", eval_loader=None, **extra)

    full = make_trainer(recipe(save_folder=str(tmp_path / "reference")))
    full.fit()
    trainer = make_trainer(recipe())
    limit = FileSizeLimit(at=3, limit=16 << 10)  # smaller than a model shard
    trainer.callbacks.insert(0, limit)
    try:
        with pytest.raises(ConfigError) as caught:
            trainer.fit()
    finally:
        limit.restore()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("save_folder: could not write checkpoint 'ep0-ba4'") and "File too large" in message
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["ep0-ba2", "latest"]  # no partial left
    resumed = make_trainer(recipe(autoresume=True))
    resumed.fit()
    for name, value in full.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name


def test_autoresume_falls_back_to_the_newest_checkpoint_when_latest_names_a_deleted_one(saved, tmp_path):
    from llmfoundry.train.checkpoint import latest_checkpoint

    _, original = saved
    folder = tmp_path / "ckpt"
    for name in ("ep0-ba2", "ep0-ba4"):
        shutil.copytree(original, folder / name)
    (folder / "latest").write_text("ep0-ba6\n")  # a damaged ep0-ba6 was deleted by hand
    assert latest_checkpoint(folder) == folder / "ep0-ba4"
