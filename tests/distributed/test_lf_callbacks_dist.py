"""llm-foundry's callbacks on two ranks (gloo, CPU): under FSDP they gather shards and sum norms across ranks, so
what they report and write matches a DDP run of the same recipe."""

from __future__ import annotations

import json

import pytest
import torch

from tests.distributed.helpers import run_job

pytestmark = [pytest.mark.dist, pytest.mark.slow]


def test_callbacks_report_the_same_on_fsdp_shards_as_on_ddp(dist_recipe, tmp_path):
    callbacks = {"optimizer_monitor": {"batch_log_interval": 2}, "system_metrics_monitor": {},
                 "generate_callback": {"prompts": ["the", "a b"], "interval": "2ba", "max_new_tokens": 3}}
    runs = {}
    for name, fsdp in (("ddp", None), ("fsdp", {"sharding_strategy": "FULL_SHARD", "mixed_precision": "FULL"})):
        recipe = dist_recipe(max_duration="2ba", scheduler=None, fsdp_config=fsdp, loggers={
            "jsonl": {"path": str(tmp_path / f"{name}.jsonl")}}, callbacks=dict(callbacks, mono_checkpoint_saver={
                "save_folder": str(tmp_path / name), "batch_interval": 2}))
        run_job(recipe, tmp_path, name)
        rows = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
        runs[name] = [r for r in rows if r.get("step") == 2][-1]
    ddp, fsdp = runs["ddp"], runs["fsdp"]
    norms = [k for k in ddp if k.startswith("l2_norm/")]
    assert "l2_norm/grad/global" in norms and any(k.startswith("l2_norm/update/model.") for k in norms)
    for key in norms:  # FSDP's shards summed across ranks give the full norms
        assert fsdp[key] == pytest.approx(ddp[key], rel=1e-3, abs=1e-7), key
    assert "cpu_percentage" in fsdp and "network_bytes_recv" in fsdp
    a = torch.load(tmp_path / "ddp" / "ep0-ba2.pt", weights_only=True)["state"]["model"]
    b = torch.load(tmp_path / "fsdp" / "ep0-ba2.pt", weights_only=True)["state"]["model"]
    assert a.keys() == b.keys()  # the FSDP file holds whole tensors, gathered from both ranks
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-3, atol=1e-5)
