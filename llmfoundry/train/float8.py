"""``precision: amp_fp8``: float8 training through torchao (llm-foundry's key; its own path uses TransformerEngine).

The Linear layers inside the transformer blocks become torchao ``Float8Linear``s (dynamic tensorwise scaling: the
inputs, weights and output gradients are cast to float8 per matmul, the weights stay fp32 masters); everything else
runs under bf16 autocast as amp_bf16 does. The conversion runs before activation checkpointing, compile and FSDP2
wrap the model (see parallel.py), on a meta model too, and leaves parameter names as they were, so checkpoints of
amp_fp8 and amp_bf16 runs load into each other.

Only Linears inside ``model.blocks()`` are converted: the embeddings and the output head stay in bf16 (torchtitan
leaves its output layer too: float8 there costs accuracy for little speed), and so does any Linear whose in or
out features are not multiples of 16, which float8 matmuls (``torch._scaled_mm``) need.

Under FSDP2, float8 all-gather (``enable_fsdp_float8_all_gather``) casts the weight shards to float8 before they
are gathered: half the all-gather bytes of bf16. Their parameters are then torchao tensor subclasses; state dicts
hold the plain tensors inside them (see ``_plain_weight``).

Whether this machine can train in float8 at all (a CUDA GPU of compute capability 8.9 or newer, torchao installed)
is checked before anything is built: core/precision.supported_precision.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from llmfoundry.core.errors import ConfigError
from llmfoundry.core.notices import notice_once
from llmfoundry.core.precision import FLOAT8_INSTALL

MULTIPLE = 16  # torch._scaled_mm wants both matmul dimensions divisible by 16


def float8_eligible(module: nn.Module, inside_blocks: set[int]) -> bool:
    """Whether ``module`` is a Linear that float8 training converts (see the module docstring)."""
    return (type(module) is nn.Linear and id(module) in inside_blocks and module.in_features % MULTIPLE == 0
            and module.out_features % MULTIPLE == 0)


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` without torchao's all-gather wrapper (same storage): the plain tensor the wrapper holds."""
    if isinstance(tensor, DTensor):
        local = tensor.to_local()
        inner = getattr(local, "_tensor", None)
        if type(local) is torch.Tensor or inner is None:
            return tensor
        return DTensor.from_local(inner, tensor.device_mesh, tensor.placements, run_check=False,
                                  shape=tensor.shape, stride=tensor.stride())
    inner = getattr(tensor, "_tensor", None)
    return tensor if type(tensor) is torch.Tensor or inner is None else inner


def _plain_weight(module: nn.Module, state_dict: dict, prefix: str, local_metadata) -> None:
    """State dicts (checkpoints, exports) hold the plain weight, not the float8 all-gather wrapper: DCP pickles a
    tensor subclass with its class, so a checkpoint would otherwise load only where torchao is imported (not in
    ``llmfoundry convert`` or an amp_bf16 run). The plain tensor shares the parameter's storage, so loading into
    the state dict in place (DCP) still fills the parameter."""
    key = prefix + "weight"
    if key in state_dict:
        state_dict[key] = _plain(state_dict[key])


def convert(model: nn.Module, blocks: list[nn.Module], fsdp_all_gather: bool, tp: bool = False) -> list[str]:
    """Swap the eligible Linears of ``blocks`` for torchao Float8Linears, in place. ``fsdp_all_gather``: the model
    is about to be sharded by FSDP2. Returns the names of the converted modules (none: a notice, as the run then
    computes as amp_bf16 does)."""
    if tp:  # torchao's float8 needs its own tensor-parallel styles, which layouts.py does not use
        raise ConfigError("precision: amp_fp8 does not combine with tp_config here (use amp_bf16 with tensor "
                          "parallelism, or FSDP2 alone with amp_fp8)")
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError:
        raise ConfigError(f"precision: amp_fp8 trains through torchao, which is not installed ({FLOAT8_INSTALL})") \
            from None
    inside = {id(m) for block in blocks for m in block.modules()}
    originals: dict[str, nn.Module] = {}

    def chosen(module: nn.Module, name: str) -> bool:
        if float8_eligible(module, inside):
            originals[name] = module
            return True
        return False

    config = Float8LinearConfig(enable_fsdp_float8_all_gather=fsdp_all_gather)
    convert_to_float8_training(model, config=config, module_filter_fn=chosen)
    # The new modules lack what the model set on its Linears (MPT: _is_residual, _fused_splits), which its
    # initialiser reads when a meta model is materialised after this: without them out_proj and down_proj would
    # miss their residual scaling. Copied over, so amp_fp8 starts from the very values amp_bf16 does.
    standard = set(vars(nn.Linear(1, 1, device="meta")))
    converted: list[str] = []
    for name, module in model.named_modules():
        if name in originals:
            converted.append(name)
            for key, value in vars(originals[name]).items():
                if key not in standard and key not in vars(module):
                    setattr(module, key, value)
    if fsdp_all_gather:
        for name in converted:
            model.get_submodule(name).register_state_dict_post_hook(_plain_weight)
    if not converted:
        notice_once(f"precision: amp_fp8: {type(model).__name__} has no Linear layer in its blocks with both "
                    f"dimensions multiples of {MULTIPLE}, so nothing computes in float8 (it trains as amp_bf16)")
    return converted
