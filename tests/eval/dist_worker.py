"""torchrun worker: evaluate a tiny model on the tiny tasks and write rank's metrics (used by test_dist.py)."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from llmfoundry.eval.runner import ICLEvaluator
from tests.eval.test_runner import tiny_tasks


def main(tokenizer_dir: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(cfg).eval()
    evaluator = ICLEvaluator(tiny_tasks(), tokenizer, batch_size=4, max_seq_len=128)
    metrics = evaluator.evaluate(model, "cpu")
    with open(os.path.join(out_dir, f"metrics-{dist.get_rank()}.json"), "w") as f:
        json.dump(metrics, f)
    if dist.get_rank() == 0:  # the same model and tasks in one process, for comparison
        torch.manual_seed(0)
        single = LlamaForCausalLM(cfg).eval()
        world = dist.get_world_size
        dist.get_world_size = lambda *a, **k: 1  # evaluate as a single process
        dist.get_rank = lambda *a, **k: 0
        try:
            metrics_single = ICLEvaluator(tiny_tasks(), tokenizer, batch_size=4, max_seq_len=128).evaluate(single)
        finally:
            dist.get_world_size = world
        with open(os.path.join(out_dir, "metrics-single.json"), "w") as f:
            json.dump(metrics_single, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
