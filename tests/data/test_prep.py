from __future__ import annotations

import collections
import json
import re

import numpy as np
import pytest

from llmfoundry.core.errors import ConfigError
from llmfoundry.data.prep.common import tokens_dtype
from llmfoundry.data.prep.text import main as text_main


def test_tokens_dtype_is_the_smallest_that_fits():
    assert tokens_dtype(256) == np.uint8 and tokens_dtype(257) == np.uint16
    assert tokens_dtype(65536) == np.uint16 and tokens_dtype(100277) == np.uint32


def test_interrupted_text_conversion_resumes_and_reprocess_starts_over(text_folder, tokenizer_dir, tmp_path, capsys):
    out = tmp_path / "mds"
    argv = ["--input_folder", str(text_folder), "--output_folder", str(out), "--concat_tokens", "32",
            "--tokenizer", str(tokenizer_dir), "--processes", "1", "--files_per_group", "50", "--quiet"]
    assert text_main(argv) == 0
    complete = json.loads((out / "index.json").read_text())
    progress = json.loads((out / "llmfoundry_progress.json").read_text())
    assert len(progress["groups"]) == 4
    del progress["done"]["2"]  # as if the run had died while converting group 2
    (out / "llmfoundry_progress.json").write_text(json.dumps(progress))
    (out / "index.json").unlink()
    capsys.readouterr()
    assert text_main(argv) == 0
    assert "resuming: 3 of 4 groups" in capsys.readouterr().out
    assert json.loads((out / "index.json").read_text()) == complete
    with pytest.raises(ConfigError, match="--reprocess"):
        text_main([*argv[:5], "64", *argv[6:]])
    assert text_main([*argv[:5], "64", *argv[6:], "--reprocess"]) == 0


def test_json_converter_reports_file_and_line_of_bad_records(tmp_path, tokenizer_dir):
    from llmfoundry.data.prep.json_data import main_json

    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a b c"}\n{"txt": "oops"}\n')
    argv = ["--path", str(path), "--out_root", str(tmp_path / "o"), "--concat_tokens", "4",
            "--tokenizer", str(tokenizer_dir), "--num_workers", "1", "--quiet"]
    with pytest.raises(ConfigError, match=r"d\.jsonl:2: missing field 'text'"):
        main_json(argv)


def test_tokenizer_without_eos_is_a_config_error(tmp_path, tokenizer_dir):
    from llmfoundry.data.tokenizers import build_tokenizer

    with pytest.raises(ConfigError, match="no EOS token"):
        build_tokenizer(str(tokenizer_dir), {"eos_token": None})


def test_tiktoken_encoding_becomes_an_equivalent_hf_tokenizer(corpus):
    import tiktoken

    from llmfoundry.data.tokenizers import build_tokenizer

    ranks = {bytes([i]): i for i in range(256)}
    seq = [bytes([b]) for b in " ".join(corpus[:40]).encode()]
    for _ in range(60):  # a few BPE merges, learned here
        (a, b), _ = collections.Counter(zip(seq, seq[1:])).most_common(1)[0]
        ranks[a + b] = len(ranks)
        merged, i = [], 0
        while i < len(seq):
            if i + 1 < len(seq) and seq[i] == a and seq[i + 1] == b:
                merged.append(a + b)
                i += 2
            else:
                merged.append(seq[i])
                i += 1
        seq = merged
    pattern = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    encoding = tiktoken.Encoding("tiny", pat_str=pattern, mergeable_ranks=ranks,
                                 special_tokens={"<|endoftext|>": len(ranks)})
    tokenizer = build_tokenizer("tiktoken", {"encoding": encoding, "model_max_length": 99})
    assert tokenizer.eos_token_id == encoding.eot_token and tokenizer.model_max_length == 99
    for text in corpus[40:80] + ["héllo wörld 123  x\n\n y"]:
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == encoding.encode_ordinary(text)


def _hf_convert(tmp_path, tokenizer_dir, *dataset_args):
    from llmfoundry.cli import run_main
    from llmfoundry.data.prep.json_data import main_hf

    return run_main(main_hf, [*dataset_args, "--out_root", str(tmp_path / "out"), "--splits", "train",
                              "--concat_tokens", "4", "--tokenizer", str(tokenizer_dir), "--num_workers", "1", "--quiet"])


def test_hf_converter_json_files_and_offline_hub_ids_fail_in_one_line(tmp_path, tokenizer_dir, capsys, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a b c"}\n{"text": "d e"}\n{"text": "oops\n{"text": "x"}\n')
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    cases = [
        (["--dataset", "json", "--data_files", str(bad)], r"^error: .*bad\.jsonl:3: malformed JSON"),
        (["--dataset", "json", "--data_files", str(empty)], r"^error: --data_files: '.*empty\.jsonl' is empty"),
        (["--dataset", "someone/not-cached-dataset"], r"^error: --dataset: the dataset 'someone/not-cached-dataset' "
                                                      r"could not be loaded offline"),
    ]
    for args, expected in cases:
        capsys.readouterr()
        assert _hf_convert(tmp_path, tokenizer_dir, *args) == 2, args
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
        assert len(err) == 1 and re.search(expected, err[0]), (args, err)


def test_missing_eos_hint_names_the_flag_for_converters_and_the_key_for_yaml(text_folder, tokenizer_dir, tmp_path):
    from llmfoundry.data.tokenizers import build_tokenizer

    argv = ["--input_folder", str(text_folder), "--output_folder", str(tmp_path / "o"), "--concat_tokens", "32",
            "--tokenizer", str(tokenizer_dir), "--tokenizer_kwargs", '{"eos_token": null}', "--processes", "1",
            "--quiet"]
    with pytest.raises(ConfigError) as caught:
        text_main(argv)
    assert "--tokenizer_kwargs '{\"eos_token\": " in str(caught.value) and "tokenizer.kwargs" not in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        build_tokenizer(str(tokenizer_dir), {"eos_token": None})
    assert "set tokenizer.kwargs.eos_token" in str(caught.value) and "--tokenizer_kwargs" not in str(caught.value)


def custom_code_tokenizer(tokenizer_dir, folder):
    """A copy of the test tokenizer whose tokenizer_config.json points AutoTokenizer at the folder's own code."""
    import shutil

    shutil.copytree(tokenizer_dir, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="CustomTokenizer", auto_map={"AutoTokenizer": [None, "custom_tok.CustomTokenizer"]})
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "custom_tok.py").write_text("from transformers import PreTrainedTokenizerFast\n\n\n"
                                          "class CustomTokenizer(PreTrainedTokenizerFast):\n    pass\n")
    return folder


def test_text_converter_trust_remote_code_reaches_the_tokenizer(text_folder, tokenizer_dir, tmp_path):
    folder = custom_code_tokenizer(tokenizer_dir, tmp_path / "custom_tok")
    argv = ["--input_folder", str(text_folder), "--output_folder", str(tmp_path / "o"), "--concat_tokens", "32",
            "--tokenizer", str(folder), "--processes", "1", "--quiet"]
    with pytest.raises(ConfigError, match=r"^--tokenizer: .*runs its own code.*pass --trust-remote-code"):
        text_main(argv)
    assert text_main([*argv, "--trust-remote-code"]) == 0
    assert json.loads((tmp_path / "o" / "index.json").read_text())["shards"]


def concat_reference(token_lists, length, no_wrap):
    """llm-foundry's ConcatTokensDataset loop: append a document, emit samples while the buffer is full."""
    buffer, samples = [], []
    for tokens in token_lists:
        buffer = buffer + tokens
        while len(buffer) >= length:
            samples.append(buffer[:length])
            buffer = [] if no_wrap else buffer[length:]
    return samples


@pytest.mark.parametrize("no_wrap", [False, True])
def test_concatenation_matches_llm_foundry_with_and_without_no_wrap(tmp_path, corpus, tokenizer_dir, tokenizer, no_wrap):
    from llmfoundry.data.prep.json_data import main_json
    from llmfoundry.data.streaming_guard import import_streaming

    docs = [" ".join(corpus[i : i + 6]) if i % 7 == 0 else corpus[i] for i in range(60)]  # long (> 3 samples) and short
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in docs))
    argv = ["--path", str(tmp_path / "d.jsonl"), "--out_root", str(tmp_path / "o"), "--concat_tokens", "32",
            "--tokenizer", str(tokenizer_dir), "--num_workers", "1", "--quiet", *(["--no_wrap"] if no_wrap else [])]
    assert main_json(argv) == 0
    ds = import_streaming().StreamingDataset(local=str(tmp_path / "o" / "train"))
    written = [ds[i]["tokens"].tolist() for i in range(len(ds))]
    token_lists = [tokenizer(d, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for d in docs]
    assert max(len(t) for t in token_lists) > 3 * 32
    assert written == concat_reference(token_lists, 32, no_wrap)
    if no_wrap:  # a document filling a sample yields that one sample: a long document is never continued
        assert len(written) <= len(docs) < len(concat_reference(token_lists, 32, False))
        long_doc = token_lists[0]  # docs[0] is long: it starts sample 0, which holds only its first 32 tokens
        assert written[0] == long_doc[:32] and long_doc[32:64] not in written


def test_json_converter_without_concat_tokens_writes_raw_text_the_text_loader_tokenizes(tmp_path, corpus,
                                                                                       tokenizer_dir, tokenizer):
    from llmfoundry.data.loader_settings import TextDatasetSettings, TextLoaderSettings
    from llmfoundry.data.prep.json_data import main_json
    from llmfoundry.data.streaming_guard import import_streaming
    from llmfoundry.data.text import build_text_dataloader

    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in corpus[:10]))
    argv = ["--path", str(tmp_path / "d.jsonl"), "--out_root", str(tmp_path / "o"), "--quiet"]
    assert main_json(argv) == 0
    ds = import_streaming().StreamingDataset(local=str(tmp_path / "o" / "train"))
    assert [ds[i]["text"] for i in range(len(ds))] == corpus[:10]
    settings = TextLoaderSettings(dataset=TextDatasetSettings(local=str(tmp_path / "o"), split="train", max_seq_len=16),
                                  drop_last=False)
    rows = [r for b in build_text_dataloader(settings, tokenizer, 5) for r in b["input_ids"].tolist()]
    assert rows == [tokenizer(d)["input_ids"][:16] for d in corpus[:10]]  # these documents are >= 16 tokens
    with pytest.raises(ConfigError, match="^--tokenizer: only used when tokenizing; add --concat_tokens"):
        main_json([*argv[:2], "--out_root", str(tmp_path / "o2"), "--tokenizer", str(tokenizer_dir)])
    with pytest.raises(ConfigError, match="^--tokenizer: required with --concat_tokens"):
        main_json([*argv[:2], "--out_root", str(tmp_path / "o2"), "--concat_tokens", "8"])
