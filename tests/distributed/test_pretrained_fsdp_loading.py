"""2-rank FSDP2 loads of pretrained folders (torchrun, gloo, CPU): each rank reads only its shards, so a node holds
about one copy of the weights however many ranks it runs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
)

from tests.distributed.helpers import losses, run_job, torchrun_args, worker_env
from tests.models.helpers import write_pretrained_folders

pytestmark = pytest.mark.dist
peft = pytest.importorskip("peft")
WORKER = Path(__file__).with_name("_pretrained_worker.py")


def load_on_two_ranks(tmp_path: Path, specs: list[dict]) -> list[list[dict]]:
    """Each spec (name: the model builder, folder, settings, inputs) loaded by one 2-rank torchrun job; for each
    spec, both ranks' results (see _pretrained_worker.py), their shards checked against the folder."""
    for spec in specs:
        spec["settings"] = {"pretrained_model_name_or_path": str(spec["folder"]), **spec["settings"]}
        spec["folder"] = str(spec["folder"])
    (tmp_path / "specs.json").write_text(json.dumps(specs))
    run = subprocess.run([*torchrun_args(2), str(WORKER), str(tmp_path / "specs.json"), str(tmp_path)],
                         cwd=tmp_path, env=worker_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    results = [[json.loads((tmp_path / f"{i}-rank{r}.json").read_text()) for r in range(2)] for i in range(len(specs))]
    for spec, ranks in zip(specs, results):
        for result in ranks:
            assert result["checked"] > 0 and not result["wrong"], (spec["folder"], result["wrong"])
    return results


@pytest.mark.slow
def test_a_two_rank_fsdp_load_holds_about_one_copy_of_the_weights_per_node(tmp_path):
    # ~97M parameters in fp32 (~390 MB), most of them in the blocks as in real models (vocabulary 8000)
    config = LlamaConfig(vocab_size=8000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                         num_attention_heads=12, num_key_value_heads=12, tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    file = tmp_path / "llama" / "model.safetensors"
    with safe_open(file, framework="pt") as f:
        weights = sum(torch.Size(f.get_slice(k).get_shape()).numel() * 4 for k in f.keys())  # all fp32
    assert 300e6 < weights < 450e6

    [results] = load_on_two_ranks(tmp_path, [dict(name="hf_causal_lm", folder=tmp_path / "llama",
                                                  settings={"init_device": "mixed"})])
    growth = [r["peak"] - r["before"] for r in results]
    for r in results:
        print(f"rank {r['rank']}: peak - before = {(r['peak'] - r['before']) / 1e6:.0f} MB, "
              f"after - before = {(r['after'] - r['before']) / 1e6:.0f} MB")
    print(f"sum {sum(growth) / 1e6:.0f} MB for {weights / 1e6:.0f} MB of weights: {sum(growth) / weights:.2f}x")
    assert sum(growth) < 1.3 * weights
    assert all(g > 0.4 * weights for g in growth)  # each rank does hold its half


def test_hf_causal_lm_and_mpt_causal_lm_read_their_shards_on_two_ranks(tmp_path):
    inputs = torch.randint(0, 512, (2, 12), generator=torch.Generator().manual_seed(0))
    write_pretrained_folders(tmp_path)
    specs = [dict(name="hf_causal_lm", folder=tmp_path / "llama", settings={"init_device": "meta"}),
             dict(name="hf_causal_lm", folder=tmp_path / "gpt2", settings={"init_device": "mixed"}),  # tied
             dict(name="hf_causal_lm", folder=tmp_path / "llama",
                  settings={"init_device": "mixed", "pretrained_lora_id_or_path": str(tmp_path / "lora")}),
             dict(name="mpt_causal_lm", folder=tmp_path / "mpt", settings={"init_device": "meta"})]
    for spec in specs:
        spec["inputs"] = inputs.tolist()
    results = load_on_two_ranks(tmp_path, specs)
    references = [AutoModelForCausalLM.from_pretrained(tmp_path / "llama"),
                  AutoModelForCausalLM.from_pretrained(tmp_path / "gpt2"),
                  peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "llama"),
                                                 tmp_path / "lora"),
                  AutoModelForCausalLM.from_pretrained(tmp_path / "mpt")]
    for spec, ranks, reference in zip(specs, results, references):
        expected = reference.eval()(inputs).logits
        for r in ranks:
            torch.testing.assert_close(torch.tensor(r["logits"]), expected, atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_training_from_a_folder_read_shard_by_shard_follows_the_whole_read_loss_curve(dist_recipe, tmp_path):
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2)).save_pretrained(tmp_path / "llama")
    curves = {}
    for init_device in ("cpu", "mixed"):
        recipe = dist_recipe(max_duration="3ba", fsdp_config={"sharding_strategy": "FULL_SHARD"},
                             model={"name": "hf_causal_lm", "pretrained_model_name_or_path": str(tmp_path / "llama"),
                                    "init_device": init_device},
                             loggers={"jsonl": {"path": str(tmp_path / f"{init_device}.jsonl")}})
        run_job(recipe, tmp_path, init_device)
        curves[init_device] = losses(tmp_path / f"{init_device}.jsonl")
    assert sorted(curves["cpu"]) == sorted(curves["mixed"]) == [1, 2, 3]
    for step, loss in curves["cpu"].items():
        assert curves["mixed"][step] == pytest.approx(loss, rel=1e-5), step
