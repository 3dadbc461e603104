"""A meta-device MPT (``init_device: meta``) placed on 2 ranks (torchrun, gloo, CPU) with tensor parallelism, expert
parallelism or FSDP2 alone: no rank ever holds the whole model (each block is materialised, split and sharded before
the next), and every layout starts from the values of the whole model materialised from the same seed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.distributed.helpers import torchrun_args, worker_env

pytestmark = [pytest.mark.dist, pytest.mark.slow]
WORKER = Path(__file__).with_name("_meta_init_worker.py")

# ~130 MB of fp32 parameters each, ~10 MB per block: a whole copy stands well above half of it plus a block
DENSE = {"d_model": 384, "n_heads": 4, "n_layers": 14, "expansion_ratio": 4, "ffn_config": {"ffn_type": "mptglu"},
         "attn_config": {"attn_impl": "torch", "alibi": False, "rope": True, "fused_qkv": False,
                         "attn_type": "grouped_query_attention", "kv_n_heads": 2}}
MOE = {"d_model": 256, "n_heads": 4, "n_layers": 14,
       "ffn_config": {"ffn_type": "mb_dmoe", "moe_num_experts": 4, "moe_top_k": 2, "ffn_hidden_size": 1024,
                      "moe_world_size": 2}}
LAYOUTS = [
    {"name": "tp2-block-fsdp", "model": DENSE, "tp": {"strategy": "block", "tensor_parallel_degree": 2}, "fsdp": True},
    {"name": "tp2-block", "model": DENSE, "tp": {"strategy": "block", "tensor_parallel_degree": 2}, "fsdp": False},
    {"name": "ep2", "model": MOE, "tp": None, "fsdp": True},
    {"name": "fsdp", "model": DENSE, "tp": None, "fsdp": True},
]
# built from pretrained folders: the tensors the folder holds stay on meta through TP / EP and FSDP2, then each
# rank reads its parts (small models: only the values are checked)
SMALL = {"d_model": 64, "n_layers": 3}
FOLDERS = [
    {"name": "tp2-block-fsdp-folder", "model": {**DENSE, **SMALL}, "pretrained": True, "fsdp": True,
     "tp": {"strategy": "block", "tensor_parallel_degree": 2}},
    {"name": "tp2-ffn-folder", "model": {**DENSE, **SMALL}, "pretrained": True, "fsdp": False,
     "tp": {"strategy": "ffn", "tensor_parallel_degree": 2}},
    {"name": "ep2-folder", "model": {**MOE, **SMALL, "ffn_config": {**MOE["ffn_config"], "ffn_hidden_size": 48}},
     "pretrained": True, "fsdp": True, "tp": None},
]


@pytest.fixture(scope="module")
def placed(tmp_path_factory) -> dict[str, list[dict]]:
    """name -> both ranks' results (see _meta_init_worker.py); one torchrun job places every layout in turn."""
    folder = tmp_path_factory.mktemp("meta-layouts")
    (folder / "specs.json").write_text(json.dumps(LAYOUTS + FOLDERS))
    # glibc: every allocation over 64 KB mapped on its own and unmapped when freed, so that resident memory follows
    # the tensors alive (the default threshold grows, and freed heap memory stays resident for later layouts)
    env = dict(worker_env(), MALLOC_MMAP_THRESHOLD_="65536")
    run = subprocess.run([*torchrun_args(2), str(WORKER), str(folder / "specs.json"), str(folder)], cwd=folder,
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    return {s["name"]: [json.loads((folder / f"{s['name']}-rank{r}.json").read_text()) for r in range(2)]
            for s in LAYOUTS + FOLDERS}


@pytest.mark.parametrize("name", [layout["name"] for layout in LAYOUTS])
def test_a_meta_model_is_never_whole_on_a_rank_and_starts_from_the_one_rank_values(placed, name):
    for r in placed[name]:
        growth = r["peak"] - r["before"]
        print(f"{name} rank {r['rank']}: whole model {r['whole'] / 1e6:.0f} MB, held {r['held'] / 1e6:.0f} MB, "
              f"peak - before {growth / 1e6:.0f} MB")  # shown with pytest -s
        assert r["sharded"] > 0
        assert 0.4 * r["whole"] < r["held"] < 0.6 * r["whole"]  # about half of it, once placed
        # materialising the whole model first (the old TP/EP path; FSDP alone kept each full block alive until the
        # end) grew a rank by 1.0 to 1.5 x the model; one block at a time by its parts plus about one block: ~0.6 x
        assert growth < 0.8 * r["whole"], f"{name} rank {r['rank']} grew by {growth / r['whole']:.2f} x the model"
        assert r["differ"] == [], r["differ"][:5]


@pytest.mark.parametrize("name", [layout["name"] for layout in FOLDERS])
def test_a_meta_model_from_a_pretrained_folder_reads_its_parts_under_tp_and_ep(placed, name):
    for r in placed[name]:
        assert r["sharded"] > 0 and r["differ"] == [], r["differ"][:5]
