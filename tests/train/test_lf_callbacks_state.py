"""llm-foundry's registered callbacks, part 2: what changes or saves the run's state (global_lr_scaling,
layer_freezing, mono_checkpoint_saver, load_checkpoint), what logs tables (generate_callback, eval_output_logging)
and the ones refused here (async_eval, curriculum_learning, dataset_swap)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from llmfoundry.core.errors import ConfigError
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.composer_checkpoint import read_composer_checkpoint
from llmfoundry.train.recipe import TrainConfig, validate
from tests.helpers import make_trainer, weights
from tests.train.test_lf_callbacks_monitoring import TableRecorder

REPO = Path(__file__).resolve().parents[2]


class FirstBatchWeights(Callback):
    """The weights as training starts (after every on_fit_start)."""

    def __init__(self):
        self.weights = None

    def on_batch_start(self, trainer):
        if self.weights is None:
            self.weights = weights(trainer)


def test_global_lr_scaling_scales_the_lr_and_sets_decoupled_weight_decay(recipe, tmp_path):
    path = tmp_path / "m.jsonl"
    trainer = make_trainer(recipe(eval_loader=None, scheduler=None, max_duration="2ba", loggers={
        "jsonl": {"path": str(path)}}, callbacks={"lr_monitor": {}, "global_lr_scaling": {"lr_scale": 0.5,
                                                                                          "wd_pct": 0.1}}))
    trainer.fit()
    logged = [json.loads(line) for line in path.read_text().splitlines() if '"step"' in line]
    assert [r["lr-AdamW/group0"] for r in logged] == [pytest.approx(1.5e-3)] * 2
    # llm-foundry's decoupled decay lr x wd_pct = 1.5e-4 per step; torch's AdamW (decoupled_adamw here) holds it
    # divided by the initial lr, so that lr x weight_decay is that decay
    group = trainer.optimizer.param_groups[0]
    assert group["weight_decay"] == pytest.approx(0.1) and group["lr"] * group["weight_decay"] == pytest.approx(1.5e-4)


def test_layer_freezing_keeps_the_named_parameters_unchanged(recipe):
    name = "model.transformer.blocks.0.ffn.up_proj.weight"  # llm-foundry's name for it
    trainer = make_trainer(recipe(eval_loader=None, scheduler=None, max_duration="2ba", callbacks={
        "layer_freezing": {"layer_names": [name]}}))
    start = weights(trainer)
    trainer.fit()
    after = weights(trainer)
    frozen = "transformer.blocks.0.ffn.up_proj.weight"
    assert torch.equal(after[frozen], start[frozen])
    assert not torch.equal(after["transformer.blocks.1.ffn.up_proj.weight"],
                           start["transformer.blocks.1.ffn.up_proj.weight"])
    with pytest.raises(ConfigError, match=r"layer_freezing.layer_names: \['model.nope'\] not in the model"):
        make_trainer(recipe(max_duration="1ba", callbacks={"layer_freezing": {"layer_names": ["model.nope"]}})).fit()


def test_mono_checkpoint_saver_writes_composer_style_files_load_path_reads(recipe, tmp_path):
    out = tmp_path / "mono"
    trainer = make_trainer(recipe(eval_loader=None, max_duration="3ba", callbacks={
        "mono_checkpoint_saver": {"save_folder": str(out), "batch_interval": 2}}))
    trainer.fit()
    assert sorted(p.name for p in out.iterdir()) == ["ep0-ba2.pt", "ep0-ba3.pt"]
    saved = torch.load(out / "ep0-ba3.pt", weights_only=True)
    assert saved["state"]["timestamp"]["Timestamp"]["batch"] == 3
    assert saved["state"]["timestamp"]["Timestamp"]["sample_in_epoch"] == 3 * 8  # where the train loader resumes
    assert "model.transformer.wte.weight" in saved["state"]["model"]  # Composer's parameter names
    checkpoint = read_composer_checkpoint(out / "ep0-ba3.pt")
    final = weights(trainer)
    assert checkpoint.model.keys() == final.keys()
    assert all(torch.equal(checkpoint.model[k], final[k]) for k in final)
    resumed = make_trainer(recipe(eval_loader=None, max_duration="4ba", load_path=str(out / "ep0-ba3.pt"),
                                  load_weights_only=True))
    assert all(torch.equal(resumed.model.state_dict()[k], final[k]) for k in final)


def test_load_checkpoint_loads_weights_at_the_start_unless_the_run_loads_its_own(recipe, tmp_path, caplog):
    source = make_trainer(recipe(eval_loader=None, max_duration="2ba", save_folder=str(tmp_path / "a"),
                                 save_interval="2ba"))
    source.fit()
    saved = weights(source)
    load = {"load_path": str(tmp_path / "a" / "ep0-ba2"), "load_weights_only": True}
    trainer = make_trainer(recipe(eval_loader=None, max_duration="1ba", seed=99, callbacks={"load_checkpoint": load}))
    probe = FirstBatchWeights()
    trainer.callbacks.append(probe)
    trainer.fit()
    assert all(torch.equal(probe.weights[k], saved[k]) for k in saved)
    assert trainer.time.batch == 1  # weights only: the run's own time starts at 0
    # before_load (the default): the run's own load_path comes after it in Composer and replaces it
    other = make_trainer(recipe(eval_loader=None, max_duration="3ba", seed=5, save_folder=str(tmp_path / "b"),
                                save_interval="3ba"))
    other.fit()
    trainer = make_trainer(recipe(eval_loader=None, max_duration="4ba", load_path=str(tmp_path / "b" / "ep0-ba3"),
                                  callbacks={"load_checkpoint": load}))
    trainer.fit()
    assert not trainer.callbacks[0].loaded and "not loaded: the run's own checkpoint" in caplog.text
    trainer = make_trainer(recipe(eval_loader=None, max_duration="4ba", load_path=str(tmp_path / "b" / "ep0-ba3"),
                                  callbacks={"load_checkpoint": dict(load, event="after_load")}))
    probe = FirstBatchWeights()
    trainer.callbacks.append(probe)
    trainer.fit()
    assert trainer.callbacks[0].loaded and all(torch.equal(probe.weights[k], saved[k]) for k in saved)
    with pytest.raises(ConfigError, match=r"load_checkpoint.event: 'batch_end' is not supported here"):
        validate(recipe(callbacks={"load_checkpoint": dict(load, event="batch_end")}), TrainConfig)


def test_generate_callback_logs_the_models_completions(recipe, tmp_path):
    prompts = ["the quick", "a"]
    trainer = make_trainer(recipe(eval_loader=None, max_duration="2ba", callbacks={"generate_callback": {
        "prompts": prompts, "interval": "1ba", "max_new_tokens": 4, "do_sample": False}}))
    recorder = TableRecorder()
    trainer.loggers.append(recorder)
    padding_side = trainer.tokenizer.padding_side
    trainer.fit()
    assert trainer.tokenizer.padding_side == padding_side  # put back after generating
    assert [(name, columns, step) for name, columns, _, step in recorder.tables] == [
        ("generations", ["prompt", "generation"], 1), ("generations", ["prompt", "generation"], 2)]
    tokenizer, model = trainer.tokenizer, trainer.model.eval()
    expected = []
    for prompt in prompts:  # one at a time, without padding: the same greedy text
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        out = model.generate(input_ids=ids, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        expected.append([prompt, tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)])
    assert recorder.tables[-1][2] == expected


def test_tables_go_to_the_console_when_no_logger_records_them(recipe, capsys, caplog):
    make_trainer(recipe(eval_loader=None, max_duration="1ba", log_to_console=True, callbacks={"generate_callback": {
        "prompts": ["the"], "interval": "1ba", "max_new_tokens": 2}})).fit()
    assert "[generations]\nprompt | generation\nthe | " in capsys.readouterr().out
    assert "none of the run's loggers records tables" in caplog.text


def test_eval_output_logging_logs_each_icl_example(recipe, tmp_path):
    tasks = [{"label": "python_choice", "dataset_uri": str(REPO / "eval/quickstart/python_choice.jsonl"),
              "icl_task_type": "multiple_choice", "num_fewshot": [0], "continuation_delimiter": ""}]
    path = tmp_path / "m.jsonl"
    trainer = make_trainer(recipe(max_duration="2ba", eval_interval="2ba", eval_loader=None, icl_tasks=tasks,
                                  loggers={"jsonl": {"path": str(path)}},
                                  callbacks={"eval_output_logging": {"log_tokens": True}}))
    recorder = TableRecorder()
    trainer.loggers.append(recorder)
    trainer.fit()
    ((name, columns, table, step),) = recorder.tables
    assert (name, step) == ("python_choice/0-shot_step_2", 2)
    assert columns == ["input", "result", "correct_choice_idx", "category", "run_name", "input_tokens"]
    records = [json.loads(line) for line in (REPO / "eval/quickstart/python_choice.jsonl").read_text().splitlines()]
    assert len(table) == len(records)
    assert sorted(row[2] for row in table) == sorted(r["gold"] for r in records)
    logged = [json.loads(line) for line in path.read_text().splitlines() if '"step"' in line][-1]
    accuracy = [v for k, v in logged.items() if k.startswith("icl/python_choice/0-shot/")]
    assert sum(row[1] for row in table) / len(table) in [pytest.approx(v) for v in accuracy]


@pytest.mark.parametrize("name, settings, reason", [
    ("async_eval", {"interval": "1ep"}, "MosaicML platform"),
    ("curriculum_learning", {"schedule": [], "duration": "1ep"}, "Composer's iterations"),
    ("dataset_swap", {"dataset_index": 1}, "callback state in checkpoints"),
])
def test_callbacks_that_cannot_work_here_are_one_line_errors(recipe, name, settings, reason):
    with pytest.raises(ConfigError) as error:
        validate(recipe(callbacks={name: settings}), TrainConfig)
    message = str(error.value)
    assert f"callbacks.{name}: not available here: " in message and reason in message and "\n" not in message
