"""`hf_t5`: a tiny T5 (built from a config, nothing downloaded) trained on encoder-decoder finetuning batches."""

from __future__ import annotations

import pytest
import torch

from llmfoundry.core.errors import ConfigError
from llmfoundry.data.batches import count_batch_tokens
from llmfoundry.models.interface import label_offset
from llmfoundry.models.loss import causal_lm_loss
from llmfoundry.models.settings import HFT5Settings
from llmfoundry.registry import models
from tests.helpers import make_trainer, write_prompt_response_jsonl

SEQ = 48


def write_tiny_t5(out, tokenizer):
    """A 2+2-layer T5 folder whose decoder starts with the test tokenizer's pad token (as T5's own does)."""
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(vocab_size=len(tokenizer), d_model=32, d_ff=64, d_kv=8, num_layers=2, num_heads=2,
                      decoder_start_token_id=tokenizer.pad_token_id, pad_token_id=tokenizer.pad_token_id,
                      eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    T5ForConditionalGeneration(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory, tokenizer):
    return write_tiny_t5(tmp_path_factory.mktemp("t5"), tokenizer)


@pytest.fixture(scope="module")
def pr_jsonl(tmp_path_factory, corpus):
    return write_prompt_response_jsonl(tmp_path_factory.mktemp("t5data") / "train.jsonl", corpus[:40])


def t5_recipe(t5_dir, data, **overrides) -> dict:
    recipe = {
        "max_seq_len": SEQ,
        "model": {"name": "hf_t5", "pretrained_model_name_or_path": str(t5_dir), "pretrained": True},
        "tokenizer": {"name": str(t5_dir)},
        "train_loader": {"name": "finetuning", "drop_last": True,
                         "dataset": {"hf_name": "json", "hf_kwargs": {"data_files": str(data)}, "split": "train",
                                     "max_seq_len": SEQ, "decoder_only_format": False, "shuffle": True}},
        "optimizer": {"name": "decoupled_adamw", "lr": 1e-3},
        "max_duration": "2ba",
        "global_train_batch_size": 4,
        "device_train_microbatch_size": 2,
        "progress_bar": False,
        "log_to_console": False,
    }  # fmt: skip
    recipe.update(overrides)
    return recipe


def test_hf_t5_shards_encoder_and_decoder_blocks_in_running_order(t5_dir, tokenizer):
    model = models.get("hf_t5").builder(HFT5Settings(pretrained_model_name_or_path=str(t5_dir)), tokenizer)
    blocks = model.blocks()
    t5 = model.hf_model
    assert blocks == [*t5.encoder.block, *t5.decoder.block]  # encoder first: FSDP2 prefetches in this order
    assert label_offset(model) == 0 and not model.supports_sequence_id
    n = sum(p.numel() for p in t5.parameters())
    assert model.flops_per_token(16) == pytest.approx(6 * n + 12 * (2 + 2 * 2) * 16 * 16)


def test_hf_t5_loss_is_transformers_t5_loss_on_collated_batches(t5_dir, tokenizer, pr_jsonl):
    """The trainer's loss (labels not shifted) equals the loss transformers' T5 computes from labels, which is what
    llm-foundry trains on."""
    trainer = make_trainer(t5_recipe(t5_dir, pr_jsonl))
    batch = next(iter(trainer.train_loader))
    model = trainer.model.eval()
    with torch.no_grad():
        ours = model(**{k: batch[k] for k in ("input_ids", "attention_mask", "decoder_input_ids",
                                              "decoder_attention_mask")})  # fmt: skip
        theirs = model.hf_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                decoder_attention_mask=batch["decoder_attention_mask"], labels=batch["labels"])
    loss = causal_lm_loss(ours.logits, batch["labels"], offset=label_offset(model))
    torch.testing.assert_close(loss, theirs.loss)


def test_hf_t5_trains_two_batches_counting_encoder_and_decoder_tokens(t5_dir, pr_jsonl):
    recipe = t5_recipe(t5_dir, pr_jsonl, fsdp_config={"activation_checkpointing": True}, eval_interval="2ba",
                       device_eval_batch_size=8, eval_subset_num_batches=1)
    recipe["eval_loader"] = {**recipe["train_loader"], "drop_last": False}
    trainer = make_trainer(recipe)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    batches = []
    for cb_batch in iter(trainer.train_loader):
        batches.append(cb_batch)
        if len(batches) == 2:
            break
    trainer.train_loader.load_state_dict({"epoch": 0, "sample_in_epoch": 0})
    metrics = trainer.fit()
    assert trainer.time.batch == 2 and torch.isfinite(torch.tensor(metrics["loss/train/total"]))
    assert metrics["metrics/train/LanguageCrossEntropy"] == pytest.approx(metrics["loss/train/total"], rel=1e-4)
    # the eval loader's loss: transformers' T5 loss over the same (first) eval batch
    eval_batch = next(iter(trainer.eval_loaders[0][1]))
    with torch.no_grad():
        reference = trainer.model.hf_model.eval()(**{k: v for k, v in eval_batch.items() if k != "decoder_input_ids"})
    assert metrics["metrics/eval/LanguageCrossEntropy"] == pytest.approx(float(reference.loss), rel=1e-4)
    # tokens as llm-foundry counts an encoder-decoder batch: the encoder's and the decoder's, padding left out
    assert trainer.time.token == sum(int(count_batch_tokens(b)) for b in batches)
    assert trainer.time.token > sum(int(b["attention_mask"].sum()) for b in batches)
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize(("change", "error"), [
    ({"train_loader.dataset.decoder_only_format": True},
     "train_loader.dataset.decoder_only_format: model.name 'hf_t5' is an encoder-decoder model"),
    ({"model.name": "mpt_causal_lm"}, "train_loader.dataset.decoder_only_format: false makes encoder-decoder batches"),
    ({"train_loader.dataset.packing_ratio": 2}, "train_loader.dataset.packing_ratio: packing needs decoder_only_format"),
    ({"model.init_device": "meta"}, "model.init_device: 'meta' cannot load pretrained weights for hf_t5"),
    ({"icl_tasks": [{"label": "x", "dataset_uri": "x.jsonl", "icl_task_type": "language_modeling",
                     "num_fewshot": [0]}]}, "icl_tasks: ICL evaluation scores decoder-only models"),
])  # fmt: skip
def test_recipes_pairing_hf_t5_with_other_data_are_one_line_errors(t5_dir, pr_jsonl, change, error):
    from llmfoundry.train.recipe import TrainConfig, validate

    recipe = t5_recipe(t5_dir, pr_jsonl)
    for dotted, value in change.items():
        *path, last = dotted.split(".")
        node = recipe
        for step in path:
            node = node[step]
        node[last] = value
    if recipe["model"]["name"] == "mpt_causal_lm":
        recipe["model"] = {"name": "mpt_causal_lm", "d_model": 16, "n_heads": 2, "n_layers": 1, "max_seq_len": SEQ,
                           "vocab_size": 512}  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        validate(recipe, TrainConfig)
    assert any(p.startswith(error) for p in caught.value.problems), caught.value.problems


def test_hf_t5_meta_init_without_pretrained_weights_trains(t5_dir, pr_jsonl):
    recipe = t5_recipe(t5_dir, pr_jsonl)
    recipe["model"].update(pretrained=False, init_device="meta")
    trainer = make_trainer(recipe)
    assert not any(p.is_meta for p in trainer.model.parameters())
    assert torch.isfinite(torch.tensor(trainer.fit()["loss/train/total"]))


def test_hf_causal_lm_with_a_t5_folder_points_to_hf_t5(t5_dir, tokenizer):
    from llmfoundry.models.settings import HFModelSettings

    with pytest.raises(ConfigError, match="is an encoder-decoder model \\(t5\\); train it with model.name: hf_t5"):
        models.get("hf_causal_lm").builder(HFModelSettings(pretrained_model_name_or_path=str(t5_dir)), tokenizer)


@pytest.mark.slow
def test_t5_checkpoint_converts_to_a_seq2seq_folder_and_eval_refuses_it_in_one_line(t5_dir, pr_jsonl, tmp_path,
                                                                                    capsys):
    import yaml
    from transformers import AutoModelForSeq2SeqLM

    from llmfoundry import cli

    save = tmp_path / "run"
    make_trainer(t5_recipe(t5_dir, pr_jsonl, save_folder=str(save), save_interval="2ba")).fit()
    out = tmp_path / "hf"
    assert cli.main(["convert", str(save), str(out)]) == 0
    assert "AutoModelForSeq2SeqLM" in capsys.readouterr().out
    exported = AutoModelForSeq2SeqLM.from_pretrained(out)
    assert type(exported).__name__ == "T5ForConditionalGeneration"

    recipe = tmp_path / "eval.yaml"
    tasks = [{"label": "lm", "dataset_uri": "eval/local_data_tiny/tiny_counting_lm.jsonl",
              "icl_task_type": "language_modeling", "num_fewshot": [0]}]
    for load_path in (save, out):
        recipe.write_text(yaml.safe_dump({"max_seq_len": SEQ, "icl_tasks": tasks,
                                          "models": [{"model_name": "t5", "load_path": str(load_path)}]}))
        assert cli.main(["eval", str(recipe)]) == 2
        err = capsys.readouterr().err.strip().splitlines()  # (after transformers' progress bars)
        assert err[-1].startswith("error: models.t5") and "encoder-decoder model" in err[-1], err
    assert cli.main(["generate", str(save), "--prompt", "hello"]) == 2
    assert "encoder-decoder model (hf_t5) cannot be used for generation" in capsys.readouterr().err
