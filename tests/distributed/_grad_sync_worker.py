"""Two FSDP2 ranks (forked by the tests' rank server) accumulate two microbatches through parallel.gradient_sync:
each rank's gradients must be reduce-scattered shards after the first microbatch already (never the whole model's
gradients held until the last), and the sum after the last must be the two microbatches' gradients together.
After an optimizer step, the state a checkpoint saves (train.components' names worked out once) must be torch's
get_model_state_dict / get_optimizer_state_dict of the sharded model, key for key."""

import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from llmfoundry.train.components import names_of
from llmfoundry.train.parallel import gradient_sync

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
for layer in model:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
torch.manual_seed(1 + dist.get_rank())
first, second = torch.randn(3, 8), torch.randn(3, 8)

with gradient_sync(model, enabled=False):  # a microbatch that is not the last
    model(first).sum().backward()
after_first = {name: p.grad for name, p in model.named_parameters()}
missing = [name for name, grad in after_first.items() if grad is None]
if missing:
    sys.exit(f"no reduced gradient shard after the first microbatch for {missing}: held unsharded instead")
after_first = {name: grad.to_local().clone() for name, grad in after_first.items()}
with gradient_sync(model, enabled=True):  # the last one
    model(second).sum().backward()

# the same two microbatches in one backward, reduced once: the accumulated shards must match it
reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
reference.load_state_dict({k: v.full_tensor() for k, v in model.state_dict().items()})
reference(torch.cat([first, second])).sum().backward()
for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
    whole = q.grad.clone()
    dist.all_reduce(whole)
    whole /= dist.get_world_size()  # FSDP2 averages over the data-parallel ranks
    if not torch.allclose(p.grad.full_tensor(), whole, atol=1e-5):
        sys.exit(f"{name}: accumulated gradient differs from the two microbatches' together")
optimizer = torch.optim.AdamW(model.parameters())
optimizer.step()


def same(ours, theirs) -> bool:  # same keys in the same order, the same (live) local shards
    if isinstance(ours, dict):
        return list(ours) == list(theirs) and all(same(ours[k], theirs[k]) for k in ours)
    if isinstance(ours, list):
        return len(ours) == len(theirs) and all(map(same, ours, theirs))
    if isinstance(ours, torch.Tensor):
        mine, torchs = (t.to_local() if hasattr(t, "to_local") else t for t in (ours, theirs))
        return mine.data_ptr() == torchs.data_ptr() and torch.equal(mine, torchs)
    return ours == theirs


names = names_of(model)
if not (same(names.model_state(), get_model_state_dict(model))
        and same(names.optimizer_state(optimizer), get_optimizer_state_dict(model, optimizer))):
    sys.exit("the state a checkpoint saves differs from torch's get_model_state_dict / get_optimizer_state_dict")
print(f"rank {dist.get_rank()}: shards after the first microbatch, sums right after the last")
dist.destroy_process_group()
