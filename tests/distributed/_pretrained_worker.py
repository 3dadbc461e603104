"""One rank of a 2-rank FSDP2 load of a pretrained folder (tests/distributed/test_pretrained_fsdp_loading.py).

Usage: torchrun --nproc_per_node=2 _pretrained_worker.py SPECS.json OUT_DIR. Each spec names a model builder and
its settings; for each, the rank builds the model, shards it with parallel.parallelize (which reads the weights),
and writes OUT_DIR/<i>-rank<N>.json: its resident memory before the load and its peak during it, whether each of
its shards equals the matching slice of the folder's tensors (read here independently with
safetensors.torch.load_file), and optionally the logits of a forward pass.
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
from transformers import AutoModelForCausalLM, PreTrainedModel  # noqa: F401  (see below)

import llmfoundry.models.hf  # noqa: F401
import llmfoundry.models.mpt.model  # noqa: F401
from llmfoundry.models.mpt.arch import MPTModelSettings
from llmfoundry.models.settings import HFModelSettings
from llmfoundry.registry import models
from llmfoundry.train import parallel
from llmfoundry.train.settings import FSDPConfig
from tests.distributed.helpers import memory_status as status

# The builders' modules (transformers' model classes: ~130 MB resident) are imported above, before any measurement:
# the growth measured is the load's, not the imports'.
SETTINGS = {"hf_causal_lm": HFModelSettings, "mpt_causal_lm": MPTModelSettings}


def main(spec_path: str, out_dir: str) -> None:
    tdist.init_process_group("gloo")
    for i, spec in enumerate(json.loads(Path(spec_path).read_text())):
        result = load(spec)
        (Path(out_dir) / f"{i}-rank{result['rank']}.json").write_text(json.dumps(result))
    tdist.destroy_process_group()


def load(spec: dict) -> dict:
    rank = tdist.get_rank()
    settings = SETTINGS[spec["name"]](**spec["settings"])
    gc.collect()
    tdist.barrier()
    # VmHWM := VmRSS, so the peak read below is this load's (imports and start-up peaked earlier)
    Path("/proc/self/clear_refs").write_text("5")
    before = status("VmRSS")
    model = models.get(spec["name"]).builder(settings, None)
    model = parallel.parallelize(model, fsdp=FSDPConfig(), compile_cfg=None, precision="fp32",
                                 device=torch.device("cpu"), world_size=2, seed=0)
    peak, after = status("VmHWM"), status("VmRSS")
    tdist.barrier()

    # The shards against the folder (names: the model's, less the hf_causal_lm wrapper; tied weights once)
    stored = load_file(Path(spec["folder"]) / "model.safetensors")
    checked, wrong = 0, []
    for name, param in model.named_parameters():
        # the wrappers' prefixes: hf_causal_lm's, then peft's (base_model.model. ... .base_layer)
        key = name.removeprefix("hf_model.").removeprefix("base_model.model.").replace(".base_layer.", ".")
        if key not in stored:
            continue
        assert isinstance(param, DTensor), name
        offsets = param.__create_chunk_list__()[0].offsets
        local = param.to_local()
        expected = stored[key][offsets[0] : offsets[0] + local.shape[0]]
        checked += 1
        if not torch.equal(local, expected.to(local.dtype)):
            wrong.append(name)
    logits = None
    if spec.get("inputs") is not None:  # a forward under FSDP2 (every rank runs it)
        with torch.no_grad():
            logits = model.eval()(torch.tensor(spec["inputs"])).logits.tolist()
    del model, stored
    gc.collect()
    return dict(rank=rank, before=before, peak=peak, after=after, checked=checked, wrong=wrong, logits=logits)


if __name__ == "__main__":
    main(*sys.argv[1:3])
