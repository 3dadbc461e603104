"""Callbacks see a TrainState, typed, and act on the run only through its methods."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from llmfoundry.core.dist import DataShare, DistInfo
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.state import TrainState
from tests.helpers import make_trainer

PACKAGE = Path(__file__).resolve().parents[2] / "llmfoundry"
HOOKS = {name for name in vars(Callback) if name.startswith("on_")} | {"should_skip_step"}
# every module that defines callbacks (the train/callbacks package, Ray's reporter)
CALLBACK_MODULES = sorted(PACKAGE.glob("train/callbacks/*.py")) + [PACKAGE / "launch/ray_worker.py"]


def _state_holders(cls: ast.ClassDef) -> set[str]:
    """The expressions that hold the run's state in a callback class: ``state`` and every ``self.X`` a hook
    stores it in (``self._state = state``)."""
    holders = {"state"}
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id == "state":
            holders |= {ast.unparse(t) for t in node.targets if isinstance(t, ast.Attribute)}
    return holders


def _hook_problems(path: Path) -> list[str]:
    """In the module's classes: hooks whose state parameter is not annotated TrainState, any name ``trainer``,
    the state's services (the trainer behind its methods), and assignments to the state's attributes
    (``state.x = ...``, also through an attribute it was stored in, or setattr): a callback changes the run
    through the state's methods."""
    tree = ast.parse(path.read_text())
    where = path.relative_to(PACKAGE.parent)
    problems = []
    for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
        holders = _state_holders(cls)
        for node in ast.walk(cls):
            if isinstance(node, ast.FunctionDef) and node.name in HOOKS:
                params = node.args.args
                annotation = ast.unparse(params[1].annotation) if len(params) > 1 and params[1].annotation else None
                if annotation != "TrainState":
                    problems.append(f"{where}:{node.lineno} {node.name}: its state parameter is typed {annotation}")
            if isinstance(node, ast.Name) and node.id == "trainer":
                problems.append(f"{where}:{node.lineno} reads a trainer")
            if isinstance(node, ast.Attribute) and node.attr == "_services":
                problems.append(f"{where}:{node.lineno} reaches the state's services")
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif isinstance(node, ast.Call) and ast.unparse(node.func) == "setattr" and node.args:
                targets = [ast.Attribute(value=node.args[0], attr="?")]
            for target in targets:
                if isinstance(target, ast.Attribute) and ast.unparse(target.value) in holders:
                    problems.append(f"{where}:{node.lineno} assigns {ast.unparse(target)}")
    return problems


def test_every_callback_hook_is_typed_against_train_state_and_never_assigns_to_it():
    problems = [line for path in CALLBACK_MODULES for line in _hook_problems(path)]
    assert not problems, "\n".join(problems)


def test_the_check_finds_an_untyped_hook_a_trainer_and_an_assignment(tmp_path):
    sample = tmp_path / "llmfoundry" / "sample.py"
    sample.parent.mkdir()
    sample.write_text("trainer = None\n\nclass C:\n    def on_batch_end(self, state, metrics):\n        state.max_batches = 1\n"
                      "    def on_fit_start(self, state: TrainState):\n        trainer = state\n        self.run = state\n"
                      "    def later(self):\n        self.run.batch = None\n        setattr(self.run, 'time', 0)\n"
                      "        self.run._services.save()\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path / "llmfoundry"
    try:
        found = _hook_problems(sample)
    finally:
        PACKAGE = saved
    assert sorted(line.split(" ", 1)[1] for line in found) == sorted([
        "on_batch_end: its state parameter is typed None", "assigns state.max_batches", "reads a trainer",
        "assigns self.run.batch", "assigns self.run.?", "reaches the state's services"])


def _state(batch: int = 0) -> TrainState:
    state = TrainState(run_name="r", dist=DistInfo(0, 1, 0, torch.device("cpu")), precision="fp32",
                       data_share=DataShare(), log_to_console=False)
    state.time.batch = batch
    return state


def test_a_stop_request_holds_when_max_duration_is_estimated_again():
    state = _state(batch=3)
    state.end_at(10)
    state.request_stop("enough")
    assert (state.max_batches, state.stop_reason) == (3, "enough")
    state.end_at(12)  # the trainer re-estimates a tok / sp max_duration after every batch
    assert state.max_batches == 3
    with pytest.raises(AttributeError):
        state.max_batches = 20  # only through request_stop


def test_a_stop_requested_at_or_after_the_end_changes_nothing():
    state = _state(batch=5)
    state.end_at(5)
    state.request_stop("late")
    assert (state.max_batches, state.stop_reason) == (5, None)


def test_an_eval_run_state_cannot_save_and_says_so():
    with pytest.raises(RuntimeError, match="cannot save or restore"):
        _state().save()


class StopAndSave(Callback):
    """Asks the run to stop at batch ``at`` and records what the state showed at each hook."""

    def __init__(self, at: int):
        self.at, self.saved, self.seen = at, [], []

    def on_batch_end(self, state: TrainState, metrics):
        self.seen.append((state.time.batch, state.metrics is metrics, state.batch["input_ids"].shape[0]))
        if state.time.batch == self.at:
            self.saved.append(state.save())
            state.request_stop("test")

    def on_checkpoint_saved(self, state: TrainState, path):
        self.saved.append(f"hook {path}")


def test_a_callback_saves_and_stops_the_run_through_its_state(recipe, tmp_path):
    trainer = make_trainer(recipe(eval_loader=None, max_duration="6ba", save_folder=str(tmp_path / "ck"),
                                  save_interval="10ba"))
    callback = StopAndSave(at=2)
    trainer.callbacks.append(callback)
    trainer.fit()
    assert trainer.time.batch == 2
    assert [batch for batch, _, _ in callback.seen] == [1, 2]
    assert all(same for _, same, _ in callback.seen)  # state.metrics is the dict the hook may extend
    saved = sorted(p.name for p in (tmp_path / "ck").iterdir() if p.name.startswith("ep"))
    assert saved == ["ep0-ba2"]  # the callback's save; the end of training does not save the same batch again
    path = callback.saved[-1]  # what state.save() returned, after the on_checkpoint_saved hooks ran
    assert path.endswith("ep0-ba2") and callback.saved == [f"hook {path}", path]
    assert trainer.state.stop_reason == "test"
