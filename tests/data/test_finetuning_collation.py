"""Finetuning batches as llm-foundry's collators make them: encoder-decoder batches (decoder_only_format: false) and
the tokenizer's padding side."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from llmfoundry.data.finetuning import build_encdec_example
from llmfoundry.data.loader_settings import FinetuningDatasetSettings
from llmfoundry.data.text import IGNORE_INDEX
from tests.data.test_finetuning import build, chat_jsonl
from tests.helpers import write_prompt_response_jsonl


@pytest.fixture(scope="module")
def left_tokenizer(tokenizer_dir):
    return AutoTokenizer.from_pretrained(str(tokenizer_dir), padding_side="left")


def test_encoder_decoder_batches_hold_context_target_and_the_decoders_inputs(tmp_path, corpus, tokenizer):
    path = chat_jsonl(tmp_path / "chat.jsonl", corpus, n=12)
    loader = build(path, tokenizer, batch=4, decoder_only_format=False, max_seq_len=96, shuffle=False)
    batch = next(iter(loader))
    assert set(batch) == {"input_ids", "attention_mask", "labels", "decoder_input_ids", "decoder_attention_mask"}
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    labels, decoder_ids = batch["labels"], batch["decoder_input_ids"]
    assert labels.shape == decoder_ids.shape == batch["input_ids"].shape == (4, 96)
    # the decoder reads the target one position on, after the pad token (T5's start), padding as pad
    assert (decoder_ids[:, 0] == pad).all()
    shifted = labels[:, :-1].masked_fill(labels[:, :-1] == IGNORE_INDEX, pad)
    assert torch.equal(decoder_ids[:, 1:], shifted)
    assert torch.equal(batch["decoder_attention_mask"].bool(), labels != IGNORE_INDEX)
    for i, example in enumerate(loader.dataset[j] for j in range(4)):  # no shuffle: the first 4 examples
        n, m = len(example["input_ids"]), len(example["labels"])
        assert batch["input_ids"][i, :n].tolist() == example["input_ids"] and (batch["input_ids"][i, n:] == pad).all()
        assert batch["attention_mask"][i].sum() == n
        assert labels[i, :m].tolist() == example["labels"] and labels[i, m - 1] == eos  # the target ends with EOS
        assert (labels[i, m:] == IGNORE_INDEX).all()


def test_encoder_decoder_truncation_keeps_the_beginning_and_ends_with_eos():
    ds = FinetuningDatasetSettings(hf_name="json", decoder_only_format=False, max_seq_len=8)
    eos = 0
    example = build_encdec_example([(list(range(10, 30)), list(range(40, 60)) + [eos])], ds)
    # llm-foundry's Seq2SeqFinetuningCollator: the first max_seq_len - 1 tokens, then EOS, for context and target
    assert example == {"input_ids": [10, 11, 12, 13, 14, 15, 16, eos], "labels": [40, 41, 42, 43, 44, 45, 46, eos]}
    short = build_encdec_example([([1, 2], [3, eos])], ds)
    assert short == {"input_ids": [1, 2], "labels": [3, eos]}  # no EOS added to a context that fits
    assert build_encdec_example([([], [3, eos])], ds) is None  # an empty context: dropped, as llm-foundry does


def _rows(batch, key):
    return [[t for t, m in zip(row, mask) if m] for row, mask in zip(batch[key].tolist(), batch["attention_mask"].tolist())]


def test_left_padding_tokenizer_pads_decoder_only_rows_on_the_left(tmp_path, corpus, tokenizer, left_tokenizer):
    path = write_prompt_response_jsonl(tmp_path / "pr.jsonl", corpus[:16])
    right = next(iter(build(path, tokenizer, batch=4, max_seq_len=128)))
    left = next(iter(build(path, left_tokenizer, batch=4, max_seq_len=128)))
    lengths = right["attention_mask"].sum(1)
    assert (lengths < 128).all()  # every row has padding
    for i, n in enumerate(lengths.tolist()):
        assert (left["attention_mask"][i, :128 - n] == 0).all() and (left["attention_mask"][i, 128 - n:] == 1).all()
        assert (left["input_ids"][i, :128 - n] == tokenizer.pad_token_id).all()
        assert (left["labels"][i, :128 - n] == IGNORE_INDEX).all()
        # the same tokens and labels, moved to the right end of the row
        assert torch.equal(left["input_ids"][i, 128 - n:], right["input_ids"][i, :n])
        assert torch.equal(left["labels"][i, 128 - n:], right["labels"][i, :n])


def test_left_padding_packed_rows_and_trimmed_rows_keep_their_right_end(tmp_path, corpus, left_tokenizer):
    path = write_prompt_response_jsonl(tmp_path / "pr.jsonl", corpus[:32])
    packed = next(iter(build(path, left_tokenizer, batch=2, max_seq_len=128, packing_ratio=3)))
    assert (packed["attention_mask"][:, -1] == 1).all() and (packed["sequence_id"][:, -1] >= 0).all()
    assert torch.equal(packed["sequence_id"] < 0, packed["attention_mask"] == 0)  # padding (-1) only on the left
    trimmed = next(iter(build(path, left_tokenizer, batch=4, max_seq_len=128, allow_pad_trimming=True)))
    assert trimmed["input_ids"].shape[1] == int(trimmed["attention_mask"].sum(1).max())
    assert (trimmed["attention_mask"][:, -1] == 1).all()


def test_left_padded_batches_give_the_same_loss_as_right_padded_ones(tmp_path, corpus, tokenizer, left_tokenizer):
    """What padding on the left must not change: each row's loss (positions count from the first real token)."""
    from llmfoundry.models.loss import causal_lm_loss
    from tests.models.helpers import tiny_model

    model = tiny_model().eval()
    path = write_prompt_response_jsonl(tmp_path / "pr.jsonl", corpus[:8])
    losses = {}
    for side, tok in (("right", tokenizer), ("left", left_tokenizer)):
        batch = next(iter(build(path, tok, batch=4, max_seq_len=128)))
        with torch.no_grad():
            logits = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        losses[side] = causal_lm_loss(logits, batch["labels"], reduction="sum")
    assert torch.isfinite(losses["left"])
    torch.testing.assert_close(losses["left"], losses["right"], rtol=1e-4, atol=1e-4)


def test_tokenizer_padding_side_from_recipe_kwargs_reaches_the_collator(tmp_path, corpus, tokenizer_dir, mds_root):
    from tests.helpers import make_trainer, tiny_recipe

    path = write_prompt_response_jsonl(tmp_path / "pr.jsonl", corpus[:16])
    loader = {"name": "finetuning", "dataset": {"hf_name": "json", "hf_kwargs": {"data_files": str(path)},
                                                "split": "train", "max_seq_len": 64}}
    recipe = tiny_recipe(mds_root, tokenizer_dir, train_loader=loader, eval_loader=None, max_duration="2ba",
                         global_train_batch_size=4, device_train_microbatch_size=4,
                         tokenizer={"name": str(tokenizer_dir), "kwargs": {"padding_side": "left"}})
    trainer = make_trainer(recipe)
    batch = next(iter(trainer.train_loader))
    assert (batch["attention_mask"][:, -1] == 1).all() and (batch["attention_mask"][:, 0] == 0).any()
    metrics = trainer.fit()
    assert trainer.time.batch == 2 and torch.isfinite(torch.tensor(metrics["loss/train/total"]))


def test_left_padding_tokenizer_pads_only_the_encoders_inputs_of_encoder_decoder_batches(tmp_path, corpus, tokenizer,
                                                                                       left_tokenizer):
    path = write_prompt_response_jsonl(tmp_path / "pr.jsonl", corpus[:8])
    right = next(iter(build(path, tokenizer, batch=4, decoder_only_format=False, max_seq_len=96)))
    left = next(iter(build(path, left_tokenizer, batch=4, decoder_only_format=False, max_seq_len=96)))
    for key in ("labels", "decoder_input_ids", "decoder_attention_mask"):  # the target: on the right either way
        assert torch.equal(left[key], right[key]), key
    lengths = right["attention_mask"].sum(1).tolist()
    for i, n in enumerate(lengths):  # the context: moved to the right end, as llm-foundry's tokenizer.pad does
        assert torch.equal(left["input_ids"][i, 96 - n:], right["input_ids"][i, :n])
        assert left["attention_mask"][i, : 96 - n].sum() == 0
