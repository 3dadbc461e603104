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


def _same_state(ours, theirs) -> bool:
    """The same keys in the same order, and the same tensors (the live ones: same storage, same values)."""
    if isinstance(ours, dict):
        return (isinstance(theirs, dict) and list(ours) == list(theirs)
                and all(_same_state(ours[k], theirs[k]) for k in ours))
    if isinstance(ours, list):
        return isinstance(theirs, list) and len(ours) == len(theirs) and all(map(_same_state, ours, theirs))
    if isinstance(ours, torch.Tensor):
        return (isinstance(theirs, torch.Tensor) and ours.data_ptr() == theirs.data_ptr()
                and torch.equal(ours, theirs))
    return ours == theirs


def test_state_names_worked_out_once_give_torchs_state_dicts_for_wrapped_models_and_param_groups():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    from llmfoundry.models.mpt.config import MPTConfig
    from llmfoundry.models.mpt.model import MPTForCausalLM
    from llmfoundry.train.components import names_of

    torch.manual_seed(0)
    model = MPTForCausalLM(MPTConfig(d_model=16, n_heads=2, n_layers=2, expansion_ratio=2, max_seq_len=8,
                                     vocab_size=64, attn_config={"attn_impl": "torch", "alibi": True},
                                     learned_pos_emb=False))
    model.transformer.blocks[1] = checkpoint_wrapper(model.transformer.blocks[1])  # names with a wrapper inside
    wrapped = torch.compile(model, backend="eager")  # an `_orig_mod.` prefix (compiled lazily: never run here)
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    optimizer = torch.optim.AdamW([{"params": decay}, {"params": [p for p in model.parameters()
                                                                   if all(p is not q for q in decay)],
                                                        "weight_decay": 0.0}])
    names = names_of(wrapped)
    assert names is names_of(wrapped)  # one per model, kept across saves

    # before the first step torch fills the optimizer's state with a step of zero gradients: its function answers
    assert _same_state(names.optimizer_state(optimizer), get_optimizer_state_dict(wrapped, optimizer))
    model(torch.randint(0, 64, (2, 8))).logits.sum().backward()
    optimizer.step()
    for _ in range(2):  # worked out at the first call, kept at the second
        ours, theirs = names.model_state(), get_model_state_dict(wrapped)
        assert any("_orig_mod" in k or "_checkpoint_wrapped_module" in k for k in wrapped.state_dict())
        assert _same_state(ours, theirs) and not any("_orig_mod" in k or "_checkpoint" in k for k in ours)
        assert _same_state(names.optimizer_state(optimizer), get_optimizer_state_dict(wrapped, optimizer))

    # a changed model or optimizer is named again
    model.transformer.extra = torch.nn.Linear(2, 2)
    optimizer.add_param_group({"params": list(model.transformer.extra.parameters())})
    model.transformer.extra(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    assert "transformer.extra.weight" in names.model_state()
    assert _same_state(names.model_state(), get_model_state_dict(wrapped))
    assert _same_state(names.optimizer_state(optimizer), get_optimizer_state_dict(wrapped, optimizer))
