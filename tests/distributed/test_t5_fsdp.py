"""hf_t5 under FSDP2 on 2 ranks (gloo): every encoder and decoder T5Block is sharded, and the 2 batches' losses are
those of one process training on the same global batches."""

from __future__ import annotations

import json

import pytest

from tests.distributed.helpers import losses, run_job
from tests.helpers import make_trainer, write_prompt_response_jsonl
from tests.models.test_hf_t5 import t5_recipe, write_tiny_t5

pytestmark = [pytest.mark.dist, pytest.mark.slow]

PROBE = '''
import json
from torch.distributed.fsdp import FSDPModule
from transformers.models.t5.modeling_t5 import T5Block
from llmfoundry.registry import callbacks


class ShardingProbe:
    """Writes which of the model's blocks FSDP2 sharded (on_fit_start, after parallelisation)."""

    def __getattr__(self, name):  # every other callback hook: nothing to do
        return lambda *args, **kwargs: False if name == "should_skip_step" else None

    def on_fit_start(self, trainer):
        blocks = trainer.model.blocks()
        record = {"blocks": [isinstance(b, T5Block) for b in blocks],
                  "decoder": [b.layer[0].SelfAttention.is_decoder for b in blocks],
                  "sharded": [isinstance(b, FSDPModule) for b in blocks],
                  "root_sharded": isinstance(trainer.model, FSDPModule)}
        with open(f"probe-rank{trainer.dist.rank}.json", "w") as f:
            json.dump(record, f)


callbacks.register("sharding_probe")(lambda settings=None: ShardingProbe())
'''


def test_hf_t5_shards_encoder_and_decoder_blocks_and_matches_one_process(tmp_path, tokenizer, corpus):
    t5 = write_tiny_t5(tmp_path / "t5", tokenizer)
    data = write_prompt_response_jsonl(tmp_path / "train.jsonl", corpus[:40])
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)

    def recipe(name: str) -> dict:
        r = t5_recipe(t5, data, loggers={"jsonl": {"path": str(tmp_path / f"{name}.jsonl")}})
        r["model"]["config_overrides"] = {"dropout_rate": 0.0}  # no per-rank dropout noise: losses comparable
        return r

    fsdp = recipe("fsdp")
    fsdp.update(code_paths=[str(probe)], callbacks={"sharding_probe": {}},
                fsdp_config={"sharding_strategy": "FULL_SHARD", "mixed_precision": "PURE",
                             "activation_checkpointing": True, "activation_checkpointing_reentrant": False})
    run_job(fsdp, tmp_path, "t5-fsdp", nproc=2, timeout=600)
    for rank in (0, 1):
        record = json.loads((tmp_path / f"probe-rank{rank}.json").read_text())
        assert record["blocks"] == [True] * 4 and record["decoder"] == [False, False, True, True]
        assert all(record["sharded"]) and record["root_sharded"]

    make_trainer(recipe("single")).fit()
    one, two = losses(tmp_path / "single.jsonl"), losses(tmp_path / "fsdp.jsonl")
    assert sorted(one) == sorted(two) == [1, 2]
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-4), step
