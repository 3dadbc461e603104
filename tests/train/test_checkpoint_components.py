"""Checkpointed state is a dict of components (train/components.py): each piece saves and restores itself.

- A checkpoint written before that change (tests/fixtures/checkpoint_format_v1, made by its make_fixture.py with the
  code of the day) restores every piece: time, scheduler, loader position, model, optimizer, RNG.
- A new piece of state is one file: tests/distributed/test_stateful_component.py.
- Ignore patterns, a state that could not be read back, a checkpoint without its rank0.pt.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.fixtures.checkpoint_format_v1.make_fixture import digest, restorable_state
from tests.helpers import make_trainer

FORMAT_V1 = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoint_format_v1"


def test_a_checkpoint_written_before_components_restores_every_piece_and_trains_on(recipe):
    expected = json.loads((FORMAT_V1 / "expected.json").read_text())
    trainer = make_trainer(recipe(eval_loader=None, load_path=str(FORMAT_V1 / "ep0-ba3"), max_duration="5ba"))
    restored = restorable_state(trainer)
    restored["rng_torch"] = digest(torch.get_rng_state())
    assert json.loads(json.dumps(restored)) == expected
    assert trainer.fit()["time/batch"] == 5


def test_a_callback_state_name_that_is_already_taken_is_a_one_line_error(recipe):
    from llmfoundry.core.errors import ConfigError
    from llmfoundry.train.callbacks.base import Callback

    class Clock(Callback):
        state_name = "time"

    trainer = make_trainer(recipe(eval_loader=None))
    trainer.callbacks.append(Clock())
    with pytest.raises(ConfigError, match="Clock's state_name 'time' is already a checkpoint component's name") as error:
        trainer.checkpoint_components()
    assert "\n" not in str(error.value)


def test_save_ignore_keys_leave_the_named_weights_and_sections_out(recipe, tmp_path):
    from torch.distributed.checkpoint import FileSystemReader

    from llmfoundry.train.checkpoint import _read_small_state

    trainer = make_trainer(recipe(eval_loader=None, max_duration="2ba", save_folder=str(tmp_path / "run"),
                                  save_interval="2ba", save_ignore_keys=["state/model/*wte*", "state/schedulers"]))
    trainer.fit()
    saved = set(FileSystemReader(str(tmp_path / "run" / "ep0-ba2")).read_metadata().state_dict_metadata)
    weights = {k.removeprefix("model.") for k in saved if k.startswith("model.")}
    assert weights and not any("wte" in k for k in weights)
    assert {k for k in trainer.model.state_dict() if "wte" not in k} <= weights
    assert any(k.startswith("optimizer.") for k in saved)
    small = _read_small_state(tmp_path / "run" / "ep0-ba2" / "rank0.pt")
    assert "scheduler" not in small["trainer"] and small["trainer"]["time"]["batch"] == 2


def test_a_callback_state_a_checkpoint_could_not_read_back_is_refused_when_saved(recipe, tmp_path):
    import numpy as np

    from llmfoundry.core.errors import ConfigError
    from llmfoundry.train.callbacks.base import Callback

    class Histogram(Callback):
        state_name = "histogram"

        def state_dict(self):
            return {"counts": np.zeros(3)}  # not a tensor: torch.load(weights_only=True) would refuse the file

        def load_state_dict(self, state):
            pass

    trainer = make_trainer(recipe(eval_loader=None, max_duration="2ba", save_folder=str(tmp_path / "run"),
                                  save_interval="2ba"))
    trainer.callbacks.append(Histogram())
    with pytest.raises(ConfigError, match="checkpoint component 'histogram': its state_dict\\(\\) holds more than"):
        trainer.fit()


def test_a_checkpoint_without_its_rank0_file_is_a_one_line_error_not_a_fresh_start(recipe, tmp_path):
    import shutil

    from llmfoundry.core.errors import ConfigError

    folder = tmp_path / "ep0-ba3"
    shutil.copytree(FORMAT_V1 / "ep0-ba3", folder)
    shutil.rmtree(folder / "checksums")  # (which would name the missing file first)
    (folder / "rank0.pt").unlink()
    with pytest.raises(ConfigError, match="has no rank0.pt") as error:
        make_trainer(recipe(eval_loader=None, load_path=str(folder)))
    assert "\n" not in str(error.value)
    weights_only = make_trainer(recipe(eval_loader=None, load_path=str(folder), load_weights_only=True))
    assert weights_only.time.batch == 0
