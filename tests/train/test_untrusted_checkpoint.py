"""Nothing read from a checkpoint is unpickled beyond tensors and plain values: a rank file carrying code is
refused without running it."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from llmfoundry.core.errors import ConfigError
from llmfoundry.train.checkpoint import load_checkpoint
from tests.helpers import make_trainer, tiny_recipe


class _WritesAFile:
    """Unpickling this calls os.system: what a checkpoint from an untrusted bucket could carry."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_rank_file_that_needs_code_to_unpickle_is_refused_unrun(mds_root, tokenizer_dir, tmp_path):
    trainer = make_trainer(tiny_recipe(mds_root, tokenizer_dir, max_duration="2ba", save_interval="2ba",
                                       save_folder=str(tmp_path / "ckpt"), eval_interval="2ba"))
    trainer.fit()
    checkpoint = tmp_path / "ckpt" / "ep0-ba2"
    state = torch.load(checkpoint / "rank0.pt", weights_only=True)  # what we write reads back safely
    assert set(state) >= {"trainer", "rng", "dataloader"}
    marker = tmp_path / "code-ran"
    state["trainer"]["payload"] = _WritesAFile(marker)
    with open(checkpoint / "rank0.pt", "wb") as f:
        pickle.dump(state, f)
    with pytest.raises(ConfigError, match=r"rank0\.pt' holds more than tensors and plain values, refused unread"):
        load_checkpoint(checkpoint, model=trainer.model, optimizer=trainer.optimizer)
    assert not marker.exists()


def test_dcp_metadata_that_needs_code_to_unpickle_is_refused_unrun(mds_root, tokenizer_dir, tmp_path):
    """DCP itself unpickles .metadata with plain pickle; ours is read with an allow-list of DCP's own records."""
    trainer = make_trainer(tiny_recipe(mds_root, tokenizer_dir, max_duration="2ba", save_interval="2ba",
                                       save_folder=str(tmp_path / "ckpt"), eval_interval="2ba"))
    trainer.fit()
    checkpoint = tmp_path / "ckpt" / "ep0-ba2"
    load_checkpoint(checkpoint, model=trainer.model, optimizer=trainer.optimizer)  # the real file reads back
    marker = tmp_path / "code-ran"
    with open(checkpoint / ".metadata", "wb") as f:
        pickle.dump(_WritesAFile(marker), f)
    with pytest.raises(ConfigError, match=r"\.metadata: .*refused unread .*'posix\.system'"):
        load_checkpoint(checkpoint, model=trainer.model, optimizer=trainer.optimizer)
    assert not marker.exists()
