"""Checkpointed state is a dict of components (train/state.py): each piece saves and restores itself.

- A checkpoint written before that change (tests/fixtures/checkpoint_format_v1, made by its make_fixture.py with the
  code of the day) restores every piece: time, scheduler, loader position, model, optimizer, RNG.
- A new piece of state is one file: tests/distributed/test_stateful_component.py.
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
