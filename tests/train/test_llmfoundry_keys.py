"""llm-foundry's run-level keys: each one trains what llm-foundry would, or says (one line) how it differs here."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from llmfoundry.core import notices
from llmfoundry.core.errors import ConfigError
from llmfoundry.models.loss import causal_lm_loss
from llmfoundry.train.recipe import TrainConfig, validate
from tests.helpers import make_trainer, weights


@pytest.fixture(autouse=True)
def _notices_said_afresh(monkeypatch):
    """Notices are said once per process; each test here checks its own."""
    monkeypatch.setattr(notices, "_seen", set())


def _short(recipe, **overrides):
    """A 2-batch run without evaluation, clipping (the optimizer sees the raw gradients) or warm-up."""
    values = {"max_duration": "2ba", "eval_loader": None, "algorithms": {}, "scheduler": None, "eval_interval": "2ba"}
    values.update(overrides)
    return recipe(**values)


# ----- model.loss_fn -----
def test_loss_fn_torch_and_fused_train_the_same_and_fused_says_it_is_the_plain_loss(recipe, caplog):
    losses = {}
    for name in ("torch_crossentropy", "fused_crossentropy"):
        r = _short(recipe)
        r["model"] = {**r["model"], "loss_fn": name}
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            losses[name] = make_trainer(r).fit()["loss/train/total"]
        noticed = [m for m in caplog.messages if "model.loss_fn: fused_crossentropy" in m]
        assert len(noticed) == (1 if name == "fused_crossentropy" else 0)
    assert losses["torch_crossentropy"] == losses["fused_crossentropy"]


def test_an_unknown_loss_fn_is_an_error(recipe):
    r = _short(recipe)
    r["model"] = {**r["model"], "loss_fn": "focal"}
    with pytest.raises(ConfigError, match="model.loss_fn: 'focal' is not one of"):
        validate(r, TrainConfig)


# ----- eval_loaders -----
def test_eval_loaders_log_metrics_under_each_label(recipe, mds_root):
    def loader(split):
        return {"name": "text", "dataset": {"local": str(mds_root), "split": split, "max_seq_len": 64}}

    metrics = make_trainer(_short(recipe, eval_loaders=[{"label": "heldout", **loader("val")},
                                                        {"label": "seen", **loader("train")}],
                                  eval_subset_num_batches=2)).fit()
    for label in ("heldout", "seen"):
        assert f"metrics/eval/{label}/LanguageCrossEntropy" in metrics
        assert f"metrics/eval/{label}/LanguagePerplexity" in metrics
    assert "metrics/eval/LanguageCrossEntropy" not in metrics
    assert metrics["metrics/eval/heldout/LanguageCrossEntropy"] != metrics["metrics/eval/seen/LanguageCrossEntropy"]


def test_eval_loader_with_eval_loaders_or_a_loader_without_label_is_an_error(recipe, mds_root):
    entry = {"name": "text", "dataset": {"local": str(mds_root), "split": "val", "max_seq_len": 64}}
    with pytest.raises(ConfigError, match="eval_loaders: set only one of eval_loader and eval_loaders"):
        validate(recipe(eval_loaders=[{"label": "a", **entry}]), TrainConfig)
    with pytest.raises(ConfigError, match=r"eval_loaders\[0\].label: required"):
        validate(recipe(eval_loader=None, eval_loaders=[entry]), TrainConfig)


def test_a_list_under_eval_loader_is_eval_loaders_as_in_llm_foundry(recipe, mds_root):
    entry = {"label": "heldout", "name": "text", "dataset": {"local": str(mds_root), "split": "val", "max_seq_len": 64}}
    cfg = validate(recipe(eval_loader=[entry]), TrainConfig)
    assert cfg.eval_loader is None and [spec.label for spec in cfg.eval_loaders] == ["heldout"]


# ----- accumulate_train_batch_on_tokens, device_train_microbatch_size -----
@pytest.mark.parametrize("on_tokens", [True, False])
def test_accumulate_on_tokens_weights_by_tokens_and_false_by_samples(recipe, on_tokens):
    trainer = make_trainer(_short(recipe, accumulate_train_batch_on_tokens=on_tokens, device_train_microbatch_size=4))
    batch = next(iter(trainer.train_loader))
    batch["labels"][:4, 8:] = -100  # the first microbatch carries far fewer target tokens than the second
    halves = []
    for part in (slice(0, 4), slice(4, 8)):
        logits = trainer.model(input_ids=batch["input_ids"][part]).logits
        labels = batch["labels"][part]
        halves.append((causal_lm_loss(logits, labels, reduction="sum"), (labels[:, 1:] != -100).sum()))
    if on_tokens:  # llm-foundry's default: the mean over every target token of the batch
        expected = (halves[0][0] + halves[1][0]) / (halves[0][1] + halves[1][1])
    else:  # Composer's per-sample rule: each microbatch's mean loss, weighted by its 4 of 8 samples
        expected = (halves[0][0] / halves[0][1] + halves[1][0] / halves[1][1]) / 2
    expected.backward()
    want = {n: p.grad.clone() for n, p in trainer.model.named_parameters()}
    trainer.optimizer.zero_grad(set_to_none=True)
    got = {}
    real_step = trainer.optimizer.step
    trainer.optimizer.step = lambda *a, **k: (got.update({n: p.grad.clone() for n, p in trainer.model.named_parameters()}),
                                              real_step(*a, **k))
    loss = trainer.train_step(batch)["loss/train/total"]
    assert loss == pytest.approx(expected.item(), rel=1e-5)
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-7)


def test_a_whole_float_microbatch_is_accepted_and_a_fraction_is_an_error(recipe):
    assert validate(recipe(device_train_microbatch_size=4.0), TrainConfig).device_train_microbatch_size == 4
    with pytest.raises(ConfigError, match="device_train_microbatch_size: 2.5 is not a whole number of samples"):
        validate(recipe(device_train_microbatch_size=2.5), TrainConfig)


# ----- icl_tasks_str, eval_gauntlet_str -----
def test_icl_tasks_str_and_eval_gauntlet_str_are_the_yaml_path_forms(recipe):
    cfg = validate(recipe(icl_tasks_str="eval/yamls/tasks.yaml", eval_gauntlet_str="eval/yamls/gauntlet.yaml"),
                   TrainConfig)
    assert (cfg.icl_tasks, cfg.eval_gauntlet) == ("eval/yamls/tasks.yaml", "eval/yamls/gauntlet.yaml")
    with pytest.raises(ConfigError, match="icl_tasks_str: set only one of icl_tasks and icl_tasks_str"):
        validate(recipe(icl_tasks="a.yaml", icl_tasks_str="b.yaml"), TrainConfig)


# ----- train_subset_num_batches, spin_dataloaders -----
def test_train_subset_num_batches_ends_each_epoch_early(recipe):
    trainer = make_trainer(_short(recipe, max_duration="5ba", train_subset_num_batches=2))
    assert trainer.rates.batches_per_epoch == 2  # so "1ep" is 2 batches, as in Composer
    trainer.fit()
    assert (trainer.time.batch, trainer.time.epoch, trainer.time.batch_in_epoch) == (5, 2, 1)


def test_spin_dataloaders_false_is_accepted_with_a_notice(recipe, caplog):
    with caplog.at_level(logging.WARNING):
        make_trainer(_short(recipe, spin_dataloaders=False))
    assert any(m.startswith("spin_dataloaders: false changes nothing here") for m in caplog.messages)


# ----- metadata, flatten_metadata -----
def test_metadata_is_flattened_into_the_logged_config_unless_flatten_metadata_is_false(recipe):
    trainer = make_trainer(_short(recipe, metadata={"team": "nlp"}))
    flat = trainer.logged_config
    assert flat["team"] == "nlp" and "metadata" not in flat
    assert trainer.config_plain["metadata"] == {"team": "nlp"}  # checkpoints keep the recipe as written
    nested = make_trainer(_short(recipe, metadata={"team": "nlp"}, flatten_metadata=False)).logged_config
    assert nested["metadata"] == {"team": "nlp"} and "team" not in nested
    with pytest.raises(ConfigError, match="metadata: keys seed are already config keys"):
        make_trainer(_short(recipe, metadata={"seed": 1}))


# ----- save_filename, save_latest_filename -----
def test_composer_default_file_patterns_are_accepted_and_others_refused(recipe, caplog):
    with caplog.at_level(logging.WARNING):
        make_trainer(_short(recipe, save_filename="ep{epoch}-ba{batch}-rank{rank}.pt",
                            save_latest_filename="latest-rank{rank}.pt"))
    assert any("save_filename/save_latest_filename: Composer's defaults accepted" in m for m in caplog.messages)
    with pytest.raises(ConfigError) as error:
        validate(recipe(save_filename="ba{batch}.pt", save_latest_filename="newest"), TrainConfig)
    assert "save_filename: 'ba{batch}.pt' cannot be used" in str(error.value)
    assert "save_latest_filename: 'newest' cannot be used" in str(error.value)


# ----- save_ignore_keys, load_ignore_keys -----
def test_save_ignore_keys_leave_the_optimizer_out(recipe, tmp_path):
    make_trainer(_short(recipe, save_folder=str(tmp_path / "a"), save_ignore_keys=["state/optimizers/*"])).fit()
    resumed = make_trainer(_short(recipe, load_path=str(tmp_path / "a" / "ep0-ba2")))
    assert resumed.time.batch == 2
    assert not resumed.optimizer.state  # fresh: nothing of it was saved


def test_load_ignore_keys_keep_the_fresh_values_of_what_they_match(recipe, tmp_path):
    trained = make_trainer(_short(recipe, save_folder=str(tmp_path / "a")))
    trained.fit()
    fresh = weights(make_trainer(_short(recipe)))
    loaded = make_trainer(_short(recipe, load_path=str(tmp_path / "a" / "ep0-ba2"),
                                 load_ignore_keys=["state/model/model.transformer.wte.*", "state/timestamp"]))
    got, saved = weights(loaded), weights(trained)
    assert torch.equal(got["transformer.wte.weight"], fresh["transformer.wte.weight"])
    assert not torch.equal(got["transformer.wte.weight"], saved["transformer.wte.weight"])
    assert torch.equal(got["transformer.blocks.0.attn.Wqkv.weight"], saved["transformer.blocks.0.attn.Wqkv.weight"])
    assert loaded.time.batch == 0


def test_an_ignore_pattern_that_matches_no_state_is_an_error(recipe):
    with pytest.raises(ConfigError, match="load_ignore_keys: 'state/modle/.*' matches no state here"):
        validate(recipe(load_ignore_keys=["state/modle/*"]), TrainConfig)
    # Composer state that does not exist here: ignoring it changes nothing, so it is accepted
    validate(recipe(load_ignore_keys=["state/callbacks/*", "state/train_metrics/*"]), TrainConfig)


# ----- profiler -----
def test_profiler_writes_a_torch_trace_of_the_scheduled_batches(recipe, tmp_path):
    folder = tmp_path / "{run_name}" / "traces"
    make_trainer(_short(recipe, run_name="prof", profiler={
        "schedule": {"skip_first": 0, "wait": 0, "warmup": 1, "active": 1, "repeat": 1},
        "torch_prof_folder": str(folder), "torch_prof_profile_memory": False})).fit()
    traces = list((tmp_path / "prof" / "traces").iterdir())
    assert [t.name for t in traces] == ["rank0.2.pt.trace.json"]
    assert json.loads(traces[0].read_text())["traceEvents"]


def test_profiler_needs_a_schedule(recipe):
    with pytest.raises(ConfigError, match="profiler.schedule: required key is missing"):
        validate(recipe(profiler={"torch_prof_folder": "x"}), TrainConfig)


# ----- device_train_batch_size, device_train_grad_accum, n_gpus -----
def test_derived_batch_keys_are_accepted_when_consistent_and_named_when_not(recipe):
    make_trainer(_short(recipe, device_train_batch_size=8, device_train_grad_accum=2, n_gpus=1))
    with pytest.raises(ConfigError) as error:
        make_trainer(_short(recipe, device_train_batch_size=4, device_train_grad_accum=3, n_gpus=2))
    text = str(error.value)
    assert "n_gpus: 2 does not match the 1 processes" in text
    assert "device_train_batch_size: 4 does not match global_train_batch_size 8 / 1 data-parallel ranks = 8" in text
    assert "device_train_grad_accum: 3 does not match the 2 microbatches" in text


# ----- only_composer_checkpoint, only_hf_checkpoint -----
def test_only_composer_checkpoint_saves_the_built_model_and_does_not_train(recipe, tmp_path):
    trainer = make_trainer(_short(recipe, save_folder=str(tmp_path / "ck"), only_composer_checkpoint=True))
    before = weights(trainer)
    assert trainer.fit() == {}
    assert trainer.time.batch == 0 and (tmp_path / "ck" / "ep0-ba0" / ".metadata").exists()
    assert all(torch.equal(before[k], v) for k, v in weights(trainer).items())


def test_only_hf_checkpoint_exports_through_the_hf_checkpointer(recipe, tmp_path):
    callbacks = {"hf_checkpointer": {"save_folder": str(tmp_path / "hf"), "precision": "fp32"}}
    r = _short(recipe, callbacks=callbacks, only_hf_checkpoint=True)
    r["model"] = {**r["model"], "expansion_ratio": 4, "no_bias": True}  # what transformers' MPT can hold
    trainer = make_trainer(r)
    trainer.fit()
    assert trainer.time.batch == 0 and (tmp_path / "hf" / "huggingface" / "ba0" / "config.json").exists()
    with pytest.raises(ConfigError, match="only_hf_checkpoint: needs the hf_checkpointer callback"):
        validate(recipe(only_hf_checkpoint=True), TrainConfig)


# ----- fsdp_config.state_dict_type: local -----
def test_state_dict_type_local_saves_sharded_checkpoints_with_a_notice(recipe, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        trainer = make_trainer(_short(recipe, fsdp_config={"state_dict_type": "local"}, save_folder=str(tmp_path)))
    assert any(m.startswith("fsdp_config.state_dict_type: local is saved as sharded") for m in caplog.messages)
    trainer.fit()
    saved = tmp_path / "ep0-ba2"
    assert (saved / ".metadata").exists() and not (saved / "model_full.pt").exists()
