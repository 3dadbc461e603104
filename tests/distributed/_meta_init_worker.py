"""One rank of a 2-rank placement of a meta-device MPT (tests/distributed/test_meta_init_layouts.py).

Usage: torchrun --nproc_per_node=2 _meta_init_worker.py SPECS.json OUT_DIR. For each spec (model overrides of
tests.models.helpers.tiny_config, tp_config or None, fsdp on/off) the rank builds the model on meta, places it with
parallel.parallelize (TP / EP / FSDP2, materialising it from the seed), and writes OUT_DIR/<name>-rank<N>.json:
the bytes of the whole model's parameters, the bytes of this rank's parts, its resident memory before placement and
its peak during it, and the parameters whose values differ from the same model materialised whole from the same
seed (the one-rank path). A spec with ``pretrained: true`` is built from a folder that rank 0 saves first (its
weights perturbed, norms included); its parameters are compared with the folder's tensors instead.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch
import torch.distributed as tdist
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor

from llmfoundry.models.mpt.arch import MPTModelSettings
from llmfoundry.models.mpt.model import MPTForCausalLM
from llmfoundry.registry import models
from llmfoundry.train import parallel
from llmfoundry.train.settings import FSDPConfig, TPConfig
from tests.distributed.helpers import memory_status as status
from tests.models.helpers import tiny_config

SEED = 17


def main(spec_path: str, out_dir: str) -> None:
    tdist.init_process_group("gloo")
    for spec in json.loads(Path(spec_path).read_text()):
        if spec.get("pretrained"):
            spec["folder"] = str(Path(out_dir) / f"{spec['name']}-folder")
            if tdist.get_rank() == 0:
                save_folder(spec)
            tdist.barrier()
        result = place(spec)
        (Path(out_dir) / f"{spec['name']}-rank{result['rank']}.json").write_text(json.dumps(result))
    tdist.destroy_process_group()


def save_folder(spec: dict) -> None:
    torch.manual_seed(SEED + 1)
    model = MPTForCausalLM(tiny_config(**spec["model"]))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))  # norms too: a norm left at its initial value would show
    model.save_pretrained(spec["folder"])


def build(spec: dict) -> MPTForCausalLM:
    if spec.get("pretrained"):
        settings = MPTModelSettings(pretrained_model_name_or_path=spec["folder"], init_device="meta")
        return models.get("mpt_causal_lm").builder(settings, None)
    return MPTForCausalLM(tiny_config(**spec["model"], init_device="meta"))


def place(spec: dict) -> dict:
    rank = tdist.get_rank()
    model = build(spec)
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    gc.collect()
    tdist.barrier()
    # VmHWM := VmRSS, so the peak read below is this placement's (imports and start-up peaked earlier)
    Path("/proc/self/clear_refs").write_text("5")
    before = status("VmRSS")
    parallel.parallelize(model, fsdp=FSDPConfig() if spec["fsdp"] else None, compile_cfg=None, precision="fp32",
                         device=torch.device("cpu"), world_size=2, seed=SEED,
                         tp=TPConfig(**spec["tp"]) if spec["tp"] else None)
    peak = status("VmHWM")
    tdist.barrier()
    held = sum(getattr(p, "_local_tensor", p).numel() * p.element_size() for p in model.parameters())
    sharded = [name for name, p in model.named_parameters() if isinstance(p, DTensor)]

    if spec.get("pretrained"):
        expected = load_file(Path(spec["folder"]) / "model.safetensors")
    else:
        reference = build(spec)
        parallel.materialize(reference, "cpu", SEED)  # the whole model at once, as one rank (and the old TP/EP) did
        expected = dict(reference.named_parameters())
    differ = []
    for name, p in model.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p  # a collective: every rank walks the same names
        if name not in expected or not torch.equal(full.detach(), expected[name].detach()):
            differ.append(name)
    return {"rank": rank, "whole": whole, "held": held, "before": before, "peak": peak, "sharded": len(sharded),
            "differ": differ}


if __name__ == "__main__":
    main(*sys.argv[1:])
