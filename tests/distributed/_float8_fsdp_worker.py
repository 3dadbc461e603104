"""Two FSDP2 ranks train a meta-built tiny MPT with precision amp_fp8 through parallel.parallelize: the weights
travel as float8 in the all-gather (torchao's WeightWithDynamicFloat8CastTensor shards), and each rank's loss and the
averaged gradients must match a one-rank float8 model's (same seed, no FSDP) on the same batches. torchao's float8
casts and matmuls run on CPU, so this is the CPU analogue of float8 all-gather on GPUs. Then a DCP checkpoint of the
float8 shards loads into a fresh amp_fp8 model and into an fp32 one (no float8) with the same values."""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from llmfoundry.train import parallel
from llmfoundry.train.recipe import validate
from llmfoundry.train.settings import FSDPConfig
from tests.helpers import make_torchao_importable
from tests.models.helpers import tiny_model

make_torchao_importable()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
batches = [torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(r)) for r in range(world)]


def built(world_size: int, precision: str = "amp_fp8"):
    with torch.device("meta"):
        model = tiny_model(n_layers=2, d_model=64, n_heads=4)
    fsdp = validate({"mixed_precision": "FULL"}, FSDPConfig) if world_size > 1 else None
    wrapped = parallel.parallelize(model.train(), fsdp=fsdp, compile_cfg=None, precision=precision,
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

folder = Path(sys.argv[1]).parent / "float8_dcp"  # argv[1]: the job's (unused) recipe, in the test's tmp_path
with torch.no_grad():
    for p in sharded.parameters():
        p.mul_(1.5)  # values the fresh models' initialisation cannot have
saved = sharded.state_dict()
wrapped_kinds = {type(t.to_local()).__name__ for t in saved.values()} - {"Tensor"}
if wrapped_kinds:  # DCP would pickle them with their class: readable only where torchao is imported
    sys.exit(f"rank {rank}: the state dict holds {wrapped_kinds}, not plain tensors")
dcp.save(saved, checkpoint_id=folder)
for precision in ("amp_fp8", "fp32"):
    fresh, _ = built(world, precision)
    state = fresh.state_dict()
    dcp.load(state, checkpoint_id=folder)
    fresh.load_state_dict(state)
    for (name, p), (_, q) in zip(sharded.named_parameters(), fresh.named_parameters()):
        if not torch.equal(p.full_tensor(), q.full_tensor()):
            sys.exit(f"rank {rank}: {name}: the float8 run's checkpoint loaded into {precision} differs")
print(f"rank {rank}: the float8 checkpoint loads into amp_fp8 and fp32")
dist.destroy_process_group()
