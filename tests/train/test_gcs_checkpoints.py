"""Checkpoints in Google Cloud Storage (gcp-storage-emulator on 127.0.0.1): the S3 protocol (staged background
uploads, completion markers, ``latest``, retention, autoresume) on gs://, and one-line errors for what is not."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.train import uploads
from llmfoundry.train.recipe import TrainConfig, validate
from tests.helpers import GCS_TEST_BUCKET as BUCKET
from tests.helpers import make_trainer, weights


def names(prefix: str) -> list[str]:
    folder = objectstore.ObjectFolder(f"gs://{BUCKET}/{prefix}", stores=(objectstore.GS,))
    return [key.removeprefix(f"{prefix}/") for key in folder.list_keys()]


def test_gs_save_folder_keeps_the_newest_and_autoresumes_bitwise(recipe, gcs_server, tmp_path):
    url = f"gs://{BUCKET}/runs/a"

    def constant_lr(**kw):  # so that 6 batches + 2 resumed ones equal 8 straight ones
        return recipe(scheduler=None, eval_loader=None, **kw)

    make_trainer(constant_lr(max_duration="6ba", save_folder=url, save_interval="2ba",
                             save_num_checkpoints_to_keep=2,
                             checkpoint_upload={"staging_folder": str(tmp_path / "staging")})).fit()
    folder = uploads.RemoteCheckpoints(url)
    assert folder.complete_checkpoints() == ["ep0-ba4", "ep0-ba6"]
    assert folder.read_text("latest").strip() == "ep0-ba6"
    stored = names("runs/a")
    assert not [n for n in stored if n.startswith("ep0-ba2/")]  # retention deleted it, on GCS too
    assert {"ep0-ba6/.metadata", "ep0-ba6/rank0.pt", "ep0-ba6/config.yaml", "ep0-ba6/.complete"} <= set(stored)

    resumed = make_trainer(constant_lr(max_duration="8ba", save_folder=url, save_interval="2ba", autoresume=True,
                                       checkpoint_upload={"staging_folder": str(tmp_path / "other")}))
    assert resumed.time.batch == 6
    resumed.fit()
    straight = make_trainer(constant_lr(max_duration="8ba"))
    straight.fit()
    expected, got = weights(straight), weights(resumed)
    assert all(torch.equal(expected[k], got[k]) for k in expected)

    loaded = make_trainer(constant_lr(max_duration="8ba", load_path=f"{url}/ep0-ba4"))  # one checkpoint by URL
    assert loaded.time.batch == 4


def test_gs_where_it_is_not_supported_yet_and_a_missing_bucket_are_one_line_errors(recipe, gcs_server, tmp_path):
    plain = recipe(max_duration="1ba", callbacks={"hf_checkpointer": {"save_folder": f"gs://{BUCKET}/hf",
                                                                     "save_interval": "1ba"}})
    with pytest.raises(ConfigError) as refused:
        validate(plain, TrainConfig)
    message = str(refused.value)
    assert "callbacks.hf_checkpointer.save_folder" in message
    assert "gs:// works for the top-level save_folder and load_path and a loader's remote so far" in message

    with pytest.raises(ConfigError, match=r"save_folder: bucket 'no-such-bucket' does not exist at http://127\.0"):
        make_trainer(recipe(max_duration="1ba", eval_loader=None, save_folder="gs://no-such-bucket/run"))


def test_a_gs_checkpoint_is_resumed_by_another_process(recipe, gcs_server, tmp_path):
    """The command line, in a process of its own, reaches gs:// through the same variable (STORAGE_EMULATOR_HOST)."""
    import yaml

    url = f"gs://{BUCKET}/runs/cli"
    plain = recipe(max_duration="2ba", eval_loader=None, save_folder=url, save_interval="2ba")
    make_trainer(plain).fit()
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text(yaml.safe_dump({**plain, "max_duration": "3ba", "autoresume": True, "log_to_console": True}))
    result = subprocess.run([sys.executable, "-m", "llmfoundry.cli", "train", str(recipe_file)],
                            capture_output=True, text=True, env=dict(os.environ), timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resumed from" in result.stdout and "at batch 2" in result.stdout, result.stdout[-2000:]
    assert uploads.RemoteCheckpoints(url).read_text("latest").strip() == "ep0-ba3"


def test_gs_without_gcsfs_installed_says_which_extra_to_install(monkeypatch):
    real = objectstore.importlib.util.find_spec
    monkeypatch.setattr(objectstore.importlib.util, "find_spec", lambda name: None if name == "gcsfs" else real(name))
    with pytest.raises(ConfigError, match=r"^save_folder: 'gs://b/run': gs:// needs gcsfs \(pip install 'llmfoundry\[gcs\]'\)$"):
        objectstore.check_url("gs://b/run", "save_folder", objectstore.CHECKPOINT_STORES)
