"""The converters' faster paths (issue #17): the same token ids and bytes as the tokenizer's own call, a time
breakdown by phase, and the caller's environment left as it was."""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os

import numpy as np
from transformers import AutoTokenizer

from llmfoundry.data.prep import common, timing
from llmfoundry.data.prep.json_data import main_json
from llmfoundry.data.prep.text import main as text_main
from tests.helpers import write_text_folder

TRICKY = ["", " ", "héllo wörld 123  x\n\n y", "a<|endoftext|>b", "\t\ttabs and   spaces  "]


def _encoder_ids(tokenizer, docs):
    return common._Encoder(tokenizer, common.ConcatSpec(8)).encode(docs)


def test_fast_path_gives_the_ids_of_the_tokenizers_own_call(tokenizer_dir, corpus):
    docs = corpus[:50] + TRICKY
    for split_special in (False, True):
        for truncate in (False, True):
            fast = AutoTokenizer.from_pretrained(str(tokenizer_dir))
            fast.split_special_tokens = split_special  # the call sets the backend from it, whatever the backend holds
            fast.backend_tokenizer.encode_special_tokens = not split_special
            if truncate:  # a tokenizer.json saved with truncation: the tokenizer's own call turns it off
                fast.backend_tokenizer.enable_truncation(4)
            reference = copy.deepcopy(fast)
            assert common._plain_fast_backend(fast) is not None
            assert _encoder_ids(fast, docs) == reference(docs, add_special_tokens=False)["input_ids"]


def test_a_tokenizer_class_with_its_own_call_keeps_it(tokenizer_dir, corpus):
    class Reversing(type(AutoTokenizer.from_pretrained(str(tokenizer_dir)))):
        def __call__(self, text, **kwargs):
            out = super().__call__(text, **kwargs)
            out["input_ids"] = [ids[::-1] for ids in out["input_ids"]] if isinstance(text, list) else out["input_ids"]
            return out

    tokenizer = Reversing.from_pretrained(str(tokenizer_dir))
    assert common._plain_fast_backend(tokenizer) is None
    assert _encoder_ids(tokenizer, corpus[:5]) == tokenizer(corpus[:5], add_special_tokens=False)["input_ids"]


def test_encoder_concatenates_bos_document_eos_as_int64(tokenizer, corpus):
    docs = corpus[:20] + TRICKY
    for bos, eos in (("", ""), ("<|endoftext|>", ""), ("", "<|endoftext|>"), ("the", "<|endoftext|>")):
        flat, lengths = common._Encoder(tokenizer, common.ConcatSpec(8, bos, eos))(docs)
        pieces = [tokenizer(bos, add_special_tokens=False)["input_ids"] if bos else [],
                  tokenizer(eos, add_special_tokens=False)["input_ids"] if eos else []]
        ids = tokenizer(docs, add_special_tokens=False)["input_ids"]
        expected = [pieces[0] + doc + pieces[1] for doc in ids]
        assert flat.dtype == np.int64 and lengths.dtype == np.int64
        assert flat.tolist() == [t for doc in expected for t in doc]
        assert lengths.tolist() == [len(doc) for doc in expected]
    flat, lengths = common._Encoder(tokenizer, common.ConcatSpec(8))([])
    assert flat.size == 0 and lengths.size == 0


def _file_hashes(root):
    return {os.path.relpath(os.path.join(d, f), root): hashlib.sha256(open(os.path.join(d, f), "rb").read()).hexdigest()
            for d, _, files in os.walk(root) for f in files if f != "llmfoundry_progress.json"}


def test_worker_processes_write_the_bytes_of_one_process(tmp_path, corpus, tokenizer_dir):
    source = write_text_folder(tmp_path / "texts", corpus[:120])
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in corpus[:120]))
    hashes = {}
    for processes in ("1", "2"):
        text_out, json_out = tmp_path / f"text{processes}", tmp_path / f"json{processes}"
        assert text_main(["--input_folder", str(source), "--output_folder", str(text_out), "--concat_tokens", "32",
                          "--tokenizer", str(tokenizer_dir), "--processes", processes, "--files_per_group", "25",
                          "--eos_text", "", "--quiet"]) == 0
        assert main_json(["--path", str(jsonl), "--out_root", str(json_out), "--concat_tokens", "48", "--tokenizer",
                          str(tokenizer_dir), "--num_workers", processes, "--quiet"]) == 0
        hashes[processes] = (_file_hashes(text_out), _file_hashes(json_out))
    assert hashes["1"] == hashes["2"] and len(hashes["1"][0]) == 1 + 2 * 5  # root index + 5 parts (index, shard)


def test_text_converter_reports_time_by_phase_and_restores_the_environment(tmp_path, corpus, tokenizer_dir, caplog,
                                                                            monkeypatch):
    source = write_text_folder(tmp_path / "texts", corpus[:40])
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    for processes in ("1", "2"):
        with caplog.at_level(logging.DEBUG, logger="llmfoundry"):
            assert text_main(["--input_folder", str(source), "--output_folder", str(tmp_path / processes),
                              "--concat_tokens", "32", "--tokenizer", str(tokenizer_dir), "--processes", processes,
                              "--eos_text", "", "--quiet"]) == 0
        phases = timing.last()
        for phase in ("read input", "tokenize", "flush shards (zstd, hashes, files, index)", "merge group indexes"):
            assert phases[phase] >= 0, phase
        assert phases["wall time (this process)"] > 0
        assert ("start worker processes" in phases) == (processes == "2")
        assert any("time by phase" in r.getMessage() for r in caplog.records)
        assert os.environ["TOKENIZERS_PARALLELISM"] == "true"  # --processes 1 tokenizes on one core, then restores


def test_progress_file_bytes_are_json_dumps_of_the_progress():
    from llmfoundry.data.prep.text import _progress_json

    progress = {"settings": "abc", "groups": [["a/ü.txt", 'b "q".txt'], ["c.txt"]], "done": {"1": {"samples": 3}}}
    assert _progress_json(progress, json.dumps(progress["groups"])) == json.dumps(progress).encode()
