"""The training loop end to end on CPU: loss falls, accumulation is exact, checkpoints resume exactly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from llmfoundry.core.errors import ConfigError
from llmfoundry.data.streaming_guard import import_streaming
from tests.helpers import make_trainer, weights


def test_short_run_lowers_the_eval_loss(recipe):
    trainer = make_trainer(recipe(max_duration="30ba", eval_first=True,
                                       eval_interval="30ba"))
    trainer.fit()
    (_, first), (_, last) = trainer.history.losses[0], trainer.history.losses[-1]
    assert last < 0.8 * first
    assert trainer.time.batch == 30
    assert trainer.time.sample == 30 * 8
    assert trainer.time.token == 30 * 8 * 64


def test_gradient_accumulation_matches_one_big_batch(recipe):
    """Loss and gradients of a batch do not depend on how it is split into microbatches."""
    results = []
    for micro in (8, 3):  # 3 does not divide 8: the last microbatch is smaller and must weigh by its tokens
        trainer = make_trainer(recipe(max_duration="1ba", eval_loader=None, device_train_microbatch_size=micro))
        grads = {}
        real_step = trainer.optimizer.step

        def step_and_record(*args, **kwargs):
            grads.update({n: p.grad.clone() for n, p in trainer.model.named_parameters()})
            return real_step(*args, **kwargs)

        trainer.optimizer.step = step_and_record
        metrics = trainer.fit()
        results.append((metrics["loss/train/total"], grads))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert abs(loss_a - loss_b) < 1e-5
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-4, atol=1e-7)


def test_resume_from_load_path_continues_bitwise_identically(recipe, tmp_path):
    straight = make_trainer(recipe(eval_loader=None, save_folder=str(tmp_path / "a"),
                                        save_interval="5ba"))
    straight.fit()
    # Continue from the straight run's batch-5 checkpoint: schedule, optimizer state and data order all resume.
    resumed = make_trainer(recipe(eval_loader=None, load_path=str(tmp_path / "a" / "ep0-ba5")))
    assert resumed.time.batch == 5
    resumed.fit()
    expected, got = weights(straight), weights(resumed)
    for key in expected:
        assert torch.equal(expected[key], got[key]), key


def test_loading_a_checkpoint_of_another_architecture_is_a_one_line_error(recipe, tmp_path):
    no_bias = recipe()["model"] | {"no_bias": True}
    saved = make_trainer(recipe(model=no_bias, eval_loader=None, max_duration="2ba", save_folder=str(tmp_path / "a"),
                                save_interval="2ba"))
    saved.fit()
    with pytest.raises(ConfigError) as error:  # the recipe's model has biases, the checkpoint's has none
        make_trainer(recipe(eval_loader=None, load_path=str(tmp_path / "a"), load_weights_only=True))
    message = str(error.value)
    assert "\n" not in message and "Missing key in checkpoint state_dict: model." in message, message
    assert "load_strict_model_weights: false" in message
    partial = make_trainer(recipe(eval_loader=None, load_path=str(tmp_path / "a"), load_weights_only=True,
                                  load_strict_model_weights=False))
    assert partial.time.batch == 0  # weights only: the run starts over
    trained, loaded = weights(saved), weights(partial)
    assert all(torch.equal(trained[k], loaded[k]) for k in trained)  # every weight the checkpoint has was loaded


def test_autoresume_picks_the_latest_complete_checkpoint(recipe, tmp_path):
    folder = tmp_path / "run"
    make_trainer(recipe(eval_loader=None, max_duration="4ba", save_folder=str(folder),
                             save_interval="2ba")).fit()
    assert (folder / "latest").read_text().strip() == "ep0-ba4"
    (folder / ".ep0-ba6.partial").mkdir()  # an interrupted save must be ignored
    trainer = make_trainer(recipe(eval_loader=None, max_duration="6ba",
                                       save_folder=str(folder), save_interval="2ba", autoresume=True))
    assert trainer.time.batch == 4
    trainer.fit()
    assert (folder / "latest").read_text().strip() == "ep0-ba6"


def test_keeps_only_the_newest_checkpoints(recipe, tmp_path):
    folder = tmp_path / "run"
    make_trainer(recipe(eval_loader=None, max_duration="6ba", save_folder=str(folder),
                             save_interval="2ba", save_num_checkpoints_to_keep=2)).fit()
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == ["ep0-ba4", "ep0-ba6"]


def test_jsonl_logger_records_train_and_eval_metrics(recipe, tmp_path):
    path = tmp_path / "metrics.jsonl"
    make_trainer(recipe(max_duration="4ba", eval_interval="2ba",
                             loggers={"jsonl": {"path": str(path)}}, callbacks={"lr_monitor": {}})).fit()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert "hyperparameters" in rows[0]
    steps = [r for r in rows if "step" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert all("loss/train/total" in r and "lr-AdamW/group0" in r for r in steps)
    assert "metrics/eval/LanguageCrossEntropy" in steps[1] and "metrics/eval/LanguageCrossEntropy" not in steps[0]


def test_icl_tasks_and_gauntlet_run_at_each_evaluation(recipe, tmp_path, capsys):
    repo = Path(__file__).resolve().parents[2]
    path = tmp_path / "metrics.jsonl"
    tasks = [{"label": "python_choice", "dataset_uri": str(repo / "eval/quickstart/python_choice.jsonl"),
              "icl_task_type": "multiple_choice", "num_fewshot": [0], "continuation_delimiter": ""}]
    gauntlet = {"categories": [{"name": "code", "benchmarks": [
        {"name": "python_choice", "num_fewshot": 0, "random_baseline": 1 / 3}]}]}
    trainer = make_trainer(recipe(max_duration="4ba", eval_interval="2ba", eval_loader=None, icl_tasks=tasks,
                                  eval_gauntlet=gauntlet, log_to_console=True,
                                  loggers={"jsonl": {"path": str(path)}}))
    trainer.fit()
    rows = [json.loads(line) for line in path.read_text().splitlines() if '"step"' in line]
    logged = {r["step"]: r for r in rows}
    accuracy = logged[2]["icl/python_choice/0-shot/accuracy"]
    assert 0.0 <= accuracy <= 1.0 and "icl/python_choice/0-shot/accuracy" not in logged[1]
    expected = (logged[4]["icl/python_choice/0-shot/accuracy"] - 1 / 3) / (2 / 3)
    assert abs(logged[4]["icl/gauntlet/code"] - expected) < 1e-9
    out = capsys.readouterr().out
    assert "| code |" in out  # the gauntlet table ends the run


@pytest.mark.parametrize("overrides, message", [
    ({"eval_interval": "0dur"}, "eval_interval: must be at least one batch, got '0dur'"),  # 0 / 0ba: no eval
    ({"save_interval": "0.0dur"}, "save_interval: must be at least one batch, got '0.0dur'"),
    ({"global_train_batch_size": 4096, "device_train_microbatch_size": 8},
     "train_loader: the dataset has fewer samples than one batch (4096)"),
])  # fmt: skip
def test_durations_that_cannot_work_are_one_line_errors(recipe, overrides, message):
    with pytest.raises(ConfigError) as error:
        make_trainer(recipe(**overrides))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_eval_data_the_model_cannot_embed_is_a_one_line_error(recipe, tmp_path):
    # Eval shards tokenized with a larger vocabulary than the model's 512 embeddings.
    with import_streaming().MDSWriter(out=str(tmp_path / "val"), columns={"tokens": "ndarray:uint16"}) as writer:
        for _ in range(8):
            writer.write({"tokens": np.arange(540, 604, dtype=np.uint16)})
    cfg = recipe(eval_first=True, max_duration="1ba")
    cfg["eval_loader"]["dataset"]["local"] = str(tmp_path)
    with pytest.raises(ConfigError, match=r"data holds token id 603 .* set model.vocab_size >= 604"):
        make_trainer(cfg).fit()


def test_a_save_folder_holding_another_runs_checkpoints_is_refused_before_training(recipe, tmp_path):
    folder = tmp_path / "run"
    make_trainer(recipe(eval_loader=None, max_duration="2ba", save_folder=str(folder), save_interval="2ba")).fit()
    with pytest.raises(ConfigError, match="save_folder: .* already holds checkpoints \\(ep0-ba2\\); set autoresume"):
        make_trainer(recipe(eval_loader=None, max_duration="4ba", save_folder=str(folder), save_interval="4ba"))
    # save_overwrite and autoresume are the two ways to use it anyway
    make_trainer(recipe(eval_loader=None, max_duration="2ba", save_folder=str(folder), save_overwrite=True))
    assert make_trainer(recipe(eval_loader=None, max_duration="4ba", save_folder=str(folder),
                               autoresume=True)).time.batch == 2


def test_fsdp_cpu_offload_on_a_cpu_run_is_a_one_line_error(recipe):
    with pytest.raises(ConfigError, match="fsdp_config.cpu_offload: offloads GPU memory to the CPU; this run is on cpu"):
        make_trainer(recipe(fsdp_config={"cpu_offload": True}))
