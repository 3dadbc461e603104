from __future__ import annotations

import json
import random

import pytest
import torch

from llmfoundry.core.errors import ConfigError
from llmfoundry.data.finetuning_loader import build_finetuning_dataloader
from llmfoundry.data.loader_settings import FinetuningDatasetSettings, FinetuningLoaderSettings
from llmfoundry.data.text import IGNORE_INDEX


def chat_jsonl(path, corpus, n=60, seed=0):
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        messages = [{"role": "system", "content": "Be brief."}] if i % 3 == 0 else []
        for _ in range(rng.randint(1, 3)):
            messages.append({"role": "user", "content": rng.choice(corpus)[: rng.randint(10, 80)]})
            messages.append({"role": "assistant", "content": rng.choice(corpus)[: rng.randint(5, 60)]})
        lines.append(json.dumps({"messages": messages}))
    path.write_text("\n".join(lines))
    return path


def build(path, tokenizer, batch=4, drop_last=True, share=None, **dataset):
    dataset.setdefault("max_seq_len", 128)
    ds = FinetuningDatasetSettings(hf_name="json", hf_kwargs={"data_files": str(path)}, split="train", **dataset)
    return build_finetuning_dataloader(FinetuningLoaderSettings(dataset=ds, drop_last=drop_last), tokenizer, batch,
                                       share=share)


def test_packed_chat_batches_have_no_label_across_example_boundaries(tmp_path, corpus, tokenizer):
    loader = build(chat_jsonl(tmp_path / "chat.jsonl", corpus), tokenizer, packing_ratio="auto", shuffle=True,
                   max_seq_len=384)
    assert loader.packing_ratio > 1
    packed_rows = 0
    for batch in loader:
        ids, labels, seq = batch["input_ids"], batch["labels"], batch["sequence_id"]
        assert ids.shape == labels.shape == seq.shape == (4, 384)
        packed_rows += int((seq.max(dim=1).values > 0).sum())
        # the trainer shifts: position t predicts labels[t + 1]; that target must be in the same example
        target = labels[:, 1:] != IGNORE_INDEX
        assert torch.all(seq[:, 1:][target] == seq[:, :-1][target])
        assert torch.all(seq[:, 1:][target] >= 0)
        assert torch.all(labels[batch["attention_mask"] == 0] == IGNORE_INDEX)
    assert packed_rows > 0
    assert loader.collator.num_dropped == 0


def test_only_the_last_response_is_a_target_by_default(tmp_path, tokenizer):
    path = tmp_path / "pr.jsonl"
    path.write_text(json.dumps({"prompt": "The cat runs", "response": " over the river"}))
    batch = next(iter(build(path, tokenizer, batch=1, allow_pad_trimming=True)))
    prompt = tokenizer("The cat runs")["input_ids"]
    response = tokenizer(" over the river", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert batch["input_ids"][0].tolist() == prompt + response
    assert batch["labels"][0].tolist() == [IGNORE_INDEX] * len(prompt) + response

    batch = next(iter(build(path, tokenizer, batch=1, allow_pad_trimming=True, target_prompts="all")))
    assert batch["labels"][0].tolist()[1:] == (prompt + response)[1:]


def test_examples_truncated_to_no_target_are_dropped_and_counted(tmp_path, tokenizer, capsys):
    path = tmp_path / "pr.jsonl"
    long_prompt = "the cat runs " * 40
    path.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": long_prompt, "response": "dog"}, {"prompt": "a", "completion": "b"}]))
    loader = build(path, tokenizer, batch=1, max_seq_len=16)
    assert loader.dataset.num_dropped == 1 and len(loader.dataset) == 1
    assert "dropped 1 of 2 examples" in capsys.readouterr().out


def test_malformed_json_line_names_file_and_line(tmp_path, tokenizer):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a", "response": "b"}\n{"prompt": "a", \n')
    with pytest.raises(ConfigError, match=r"bad\.jsonl:2: malformed JSON"):
        build(path, tokenizer)


def test_missing_or_mistyped_field_names_field_and_example(tmp_path, tokenizer):
    path = tmp_path / "f.jsonl"
    path.write_text('{"prompt": "a", "response": "b"}\n{"prompt": "a"}\n')
    with pytest.raises(ConfigError, match=r"f\.jsonl:2: missing field 'response'"):
        build(path, tokenizer)
    path.write_text('{"prompt": "a", "response": 3}\n')
    with pytest.raises(ConfigError, match=r"f\.jsonl:1: field 'response' must be a string"):
        build(path, tokenizer)


def test_empty_split_is_a_config_error(tmp_path, tokenizer):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        build(path, tokenizer)


def test_finetuning_loader_resumes_mid_epoch(tmp_path, corpus, tokenizer):
    path = chat_jsonl(tmp_path / "chat.jsonl", corpus, n=40)
    full = [b["input_ids"] for b in build(path, tokenizer, shuffle=True, shuffle_seed=2)]
    first = build(path, tokenizer, shuffle=True, shuffle_seed=2)
    it = iter(first)
    next(it), next(it)
    state = first.state_dict()
    resumed = build(path, tokenizer, shuffle=True, shuffle_seed=2)
    resumed.load_state_dict(state)
    rest = [b["input_ids"] for b in resumed]
    assert len(rest) == len(full) - 2 and all(torch.equal(a, b) for a, b in zip(rest, full[2:]))


def test_finetuning_converter_output_feeds_the_loader_with_packing(tmp_path, corpus, tokenizer_dir, tokenizer):
    from llmfoundry.data.prep.cli import main

    path = chat_jsonl(tmp_path / "chat.jsonl", corpus, n=30)
    assert main(["finetuning", "--dataset", str(path), "--out_root", str(tmp_path / "ft"), "--tokenizer",
                 str(tokenizer_dir), "--max_seq_len", "256", "--splits", "train"]) == 0
    ds = FinetuningDatasetSettings(local=str(tmp_path / "ft"), split="train", max_seq_len=256, packing_ratio=2.0)
    batches = list(build_finetuning_dataloader(FinetuningLoaderSettings(dataset=ds), tokenizer, 2))
    assert batches and all(b["input_ids"].shape == (2, 256) for b in batches)
    for b in batches:
        target = b["labels"][:, 1:] != IGNORE_INDEX
        assert torch.all(b["sequence_id"][:, 1:][target] == b["sequence_id"][:, :-1][target])


def _tree_bytes(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_finetuning_converter_num_workers_tokenize_in_processes_with_identical_output(tmp_path, corpus, tokenizer_dir):
    import os

    from llmfoundry.data.prep.finetuning import main

    path = chat_jsonl(tmp_path / "chat.jsonl", corpus, n=80)
    pids = tmp_path / "pids.txt"
    (tmp_path / "pre.py").write_text(
        "import os\n\n\ndef identity(example):\n"
        f"    with open({str(pids)!r}, 'a') as f:\n        f.write(f'{{os.getpid()}}\\n')\n    return example\n")
    outputs = {}
    for workers in (1, 3):
        pids.write_text("")
        out = tmp_path / f"ft{workers}"
        assert main(["--dataset", str(path), "--out_root", str(out), "--tokenizer", str(tokenizer_dir),
                     "--max_seq_len", "64", "--splits", "train", "--preprocessor", f"{tmp_path / 'pre.py'}:identity",
                     "--num_workers", str(workers)]) == 0
        seen = set(pids.read_text().split())
        assert (seen == {str(os.getpid())}) == (workers == 1), seen  # 3 workers: tokenized in other processes
        outputs[workers] = _tree_bytes(out)
    assert outputs[1] and outputs[1] == outputs[3]


def test_finetuning_converter_llm_foundry_flags(tmp_path, corpus, tokenizer_dir, capsys):
    from llmfoundry.data.prep.finetuning import main

    path = chat_jsonl(tmp_path / "chat.jsonl", corpus, n=20)
    base = ["--dataset", str(path), "--tokenizer", str(tokenizer_dir), "--max_seq_len", "64", "--splits", "train",
            "--num_workers", "1"]
    assert main([*base, "--out_root", str(tmp_path / "a"), "--no-decoder_only_format"]) == 0
    assert main([*base, "--out_root", str(tmp_path / "b"), "--encoder_decoder", "--skip-preprocessing",
                 "--logging-level", "info"]) == 0
    assert "tokenizing split 'train'" in capsys.readouterr().err
    assert _tree_bytes(tmp_path / "a") == _tree_bytes(tmp_path / "b")
    with pytest.raises(ConfigError, match="--encoder_decoder: .*--target_prompts none"):
        main([*base, "--out_root", str(tmp_path / "c"), "--encoder_decoder", "--target_prompts", "all"])
    with pytest.raises(ConfigError, match="--skip-preprocessing: set it or --preprocessor"):
        main([*base, "--out_root", str(tmp_path / "c"), "--skip-preprocessing", "--preprocessor", "x:y"])
    with pytest.raises(ConfigError, match="--local: .*remote --out_root"):
        main([*base, "--out_root", str(tmp_path / "c"), "--local", str(tmp_path / "copy")])


def test_persistent_workers_live_across_epochs_and_batches_match_in_process(tmp_path, corpus, tokenizer):
    path = chat_jsonl(tmp_path / "chat.jsonl", corpus, n=24)

    def make(**loader):
        ds = FinetuningDatasetSettings(hf_name="json", hf_kwargs={"data_files": str(path)}, split="train",
                                       max_seq_len=128, shuffle=True, shuffle_seed=3)
        return build_finetuning_dataloader(FinetuningLoaderSettings(dataset=ds, **loader), tokenizer, 4)

    def worker_pids(loader):
        return sorted(w.pid for w in loader.dataloader._iterator._workers if w.is_alive())

    reference = make()
    expected = [[b["input_ids"] for b in reference] for _ in range(2)]
    assert not all(torch.equal(a, b) for a, b in zip(*expected))  # epoch 2 is another permutation
    for persistent in (True, False):
        loader = make(num_workers=1, persistent_workers=persistent)
        pids = []
        for epoch in range(2):
            got = [b["input_ids"] for b in loader]
            assert len(got) == len(expected[epoch]) and all(torch.equal(a, b) for a, b in zip(got, expected[epoch]))
            if persistent:
                pids.append(worker_pids(loader))
        if persistent:  # the same worker process served both epochs
            assert pids[0] and pids[0] == pids[1]
        else:
            assert loader.dataloader._iterator is None  # torch keeps no iterator (or workers) between epochs
