"""`llmfoundry eval` with fsdp_config on 2 ranks (torchrun, gloo, CPU): each model is sharded with FSDP2 across
the ranks (each rank holds half of every block's weights) and the metrics (eval loader, multiple choice, language
modeling, generation) equal a single process's."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
import yaml
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from llmfoundry.cli import main as cli_main
from tests.distributed.helpers import REPO, torchrun_args, worker_env
from tests.eval.helpers import TINY_DATA
from tests.helpers import convert_text_folder, write_text_folder

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # about 30 s: two torchrun ranks, then one process

# a plugin (code_paths) whose callback writes, per rank, how many of the model's weights that rank holds
PLUGIN = '''
import json, os
from dataclasses import dataclass
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from llmfoundry.registry import callbacks
from llmfoundry.train.callbacks.base import Callback

@dataclass
class Settings:
    folder: str = ""

class CountShards(Callback):
    def __init__(self, s):
        self.folder = s.folder

    def on_eval_start(self, run):
        params = list(run.model.parameters())
        local = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in params)
        rank = dist.get_rank() if dist.is_initialized() else 0
        with open(os.path.join(self.folder, f"shards-{run.time.batch}-{rank}.json"), "w") as f:
            json.dump({"local": local, "total": sum(p.numel() for p in params),
                       "dtensors": sum(isinstance(p, DTensor) for p in params), "params": len(params)}, f)

@callbacks.register("count_shards", config=Settings)
def build(s):
    return CountShards(s)
'''


def _hf_folder(tmp_path, tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False)
    folder = tmp_path / "tiny_llama"
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _even_eval_split(tmp_path, corpus, tokenizer_dir):
    """MDS samples of 32 tokens, an even number of them: two ranks then read every sample once (streaming pads an
    odd count by repeating a sample, which would change the metrics rather than test the sharding)."""
    source = write_text_folder(tmp_path / "text", corpus[160:])
    convert_text_folder(source, tmp_path / "mds" / "val", tokenizer_dir, 32)
    shards = json.loads((tmp_path / "mds" / "val" / "index.json").read_text())["shards"]
    assert sum(s["samples"] for s in shards) % 2 == 0
    return tmp_path / "mds"


def test_fsdp_config_shards_each_model_and_gives_the_single_process_metrics(tmp_path, tokenizer_dir, corpus,
                                                                            monkeypatch):
    folder = _hf_folder(tmp_path, tokenizer_dir)
    mds_root = _even_eval_split(tmp_path, corpus, tokenizer_dir)
    (tmp_path / "plugin.py").write_text(PLUGIN)
    recipe = {
        "max_seq_len": 64, "device_eval_batch_size": 4, "precision": "fp32", "log_config": False,
        "code_paths": [str(tmp_path / "plugin.py")],
        "models": [{"model_name": "llama", "load_path": str(folder)}],
        "eval_loader": {"name": "text", "drop_last": False,
                        "dataset": {"local": str(mds_root), "split": "val", "max_seq_len": 32}},
        "icl_tasks": [
            {"label": "mc", "dataset_uri": str(TINY_DATA / "tiny_arithmetic_mc.jsonl"),
             "icl_task_type": "multiple_choice", "num_fewshot": [0]},
            {"label": "lm", "dataset_uri": str(TINY_DATA / "tiny_counting_lm.jsonl"),
             "icl_task_type": "language_modeling", "num_fewshot": [1]},
            {"label": "qa", "dataset_uri": str(TINY_DATA / "tiny_multiplication_qa.jsonl"),
             "icl_task_type": "generation_task_with_answers", "num_fewshot": [0], "continuation_delimiter": "\nA: ",
             "generation_kwargs": {"max_new_tokens": 3}},
        ],
        "callbacks": {"count_shards": {"folder": str(tmp_path)}},
        "fsdp_config": {"sharding_strategy": "FULL_SHARD", "mixed_precision": "FULL", "limit_all_gathers": True},
    }
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    sharded = tmp_path / "sharded.json"
    proc = subprocess.run([*torchrun_args(2), str(REPO / "scripts" / "eval.py"), str(path), f"results_path={sharded}"],
                          cwd=tmp_path, env=worker_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    counts = [json.loads((tmp_path / f"shards-0-{rank}.json").read_text()) for rank in (0, 1)]
    assert all(c["dtensors"] == c["params"] for c in counts)  # every weight is sharded
    assert counts[0]["local"] + counts[1]["local"] == counts[0]["total"]  # each rank holds its half
    assert max(c["local"] for c in counts) < 0.6 * counts[0]["total"]

    monkeypatch.chdir(tmp_path)
    single = tmp_path / "single.json"
    assert cli_main(["eval", str(path), "~fsdp_config", f"results_path={single}"]) == 0
    got = json.loads(sharded.read_text())["llama"]
    want = json.loads(single.read_text())["llama"]
    assert got["sample_counts"] == want["sample_counts"]
    assert set(got["metrics"]) == set(want["metrics"])
    assert "metrics/eval/LanguageCrossEntropy" in got["metrics"] and "icl/qa/0-shot/accuracy" in got["metrics"]
    for key, value in want["metrics"].items():
        assert got["metrics"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
