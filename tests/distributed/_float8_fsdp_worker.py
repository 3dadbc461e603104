"""Two FSDP2 ranks train a meta-built tiny MPT with precision amp_fp8 through parallel.parallelize: the weights
travel as float8 in the all-gather (torchao's WeightWithDynamicFloat8CastTensor shards), and each rank's loss and the
averaged gradients must match a one-rank float8 model's (same seed, no FSDP) on the same batches. torchao's float8
casts and matmuls run on CPU, so this is the CPU analogue of float8 all-gather on GPUs."""

import sys

import torch
import torch.distributed as dist

from llmfoundry.train import parallel
from llmfoundry.train.recipe import validate
from llmfoundry.train.settings import FSDPConfig
from tests.models.helpers import tiny_model

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
batches = [torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(r)) for r in range(world)]


def built(world_size: int):
    with torch.device("meta"):
        model = tiny_model(n_layers=2, d_model=64, n_heads=4)
    fsdp = validate({"mixed_precision": "FULL"}, FSDPConfig) if world_size > 1 else None
    wrapped = parallel.parallelize(model.train(), fsdp=fsdp, compile_cfg=None, precision="amp_fp8",
                                   device=torch.device("cpu"), world_size=world_size, seed=0)
    return model, wrapped


def step(wrapped, x):
    with torch.autocast("cpu", dtype=torch.bfloat16):  # precision.autocast("amp_fp8", cpu)
        loss = wrapped(x, labels=x).loss
    loss.backward()
    return loss.detach()


sharded, wrapped = built(world)
local = sharded.blocks()[0].attn.out_proj.weight.to_local()
if type(local).__name__ != "WeightWithDynamicFloat8CastTensor":
    sys.exit(f"rank {rank}: the weight shards are {type(local).__name__}, not float8 all-gather tensors")
loss = step(wrapped, batches[rank])
single, _ = built(1)
single_losses = [step(single, x) for x in batches]  # gradients of both batches, summed
if not torch.equal(loss, single_losses[rank]):
    sys.exit(f"rank {rank}: loss {loss.item()} under FSDP2, {single_losses[rank].item()} on one rank")
for (name, p), (_, q) in zip(sharded.named_parameters(), single.named_parameters()):
    if not torch.allclose(p.grad.full_tensor(), q.grad / world, atol=1e-6, rtol=1e-5):
        sys.exit(f"rank {rank}: {name}: FSDP2's averaged gradient differs from the one-rank model's")
print(f"rank {rank}: float8 all-gather matches one rank")
dist.destroy_process_group()
