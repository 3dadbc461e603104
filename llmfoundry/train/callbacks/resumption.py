"""Changing a resumed run at its start (llm-foundry's resumption callbacks): global_lr_scaling and layer_freezing.

global_lr_scaling multiplies every parameter group's learning rate (and the schedule's base) by ``lr_scale`` and
sets the weight decay to ``lr x wd_pct``, llm-foundry's decoupled weight decay: with decoupled_adamw (which holds
its weight decay divided by the initial learning rate, see train/optim.py) the stored value is converted so that
the decay applied per step is the one llm-foundry's DecoupledAdamW would apply.

layer_freezing stops training the named parameters (``requires_grad`` off) at the start of training. Names are
llm-foundry's (``model.transformer.blocks.0.ffn.up_proj.weight``) or this model's own (without ``model.``).
"""

from __future__ import annotations

import logging

from llmfoundry.core.errors import ConfigError
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.callbacks.param_names import our_name
from llmfoundry.train.callbacks.settings import GlobalLRScalingSettings, LayerFreezingSettings
from llmfoundry.train.state import TrainState

log = logging.getLogger(__name__)


class GlobalLRScaling(Callback):
    def __init__(self, settings: GlobalLRScalingSettings):
        self.s = settings

    def on_fit_start(self, state: TrainState):
        decoupled_adamw = state.optimizer_name == "decoupled_adamw"
        for group in state.optimizer.param_groups:
            group["lr"] *= self.s.lr_scale
            if "initial_lr" in group:
                group["initial_lr"] *= self.s.lr_scale
            decay = group["lr"] * self.s.wd_pct  # llm-foundry's (decoupled) weight decay
            if decoupled_adamw:  # stored as torch's AdamW: decay / initial lr (see train/optim.py)
                initial = group.get("initial_lr", group["lr"])
                group["weight_decay"] = decay / initial if initial > 0 else 0.0
            else:
                group["weight_decay"] = decay
            log.info("global_lr_scaling: lr %g, weight decay %g", group["lr"], decay)
        scheduler = state.scheduler
        scheduler.base_lrs = [lr * self.s.lr_scale for lr in scheduler.base_lrs]


class LayerFreezing(Callback):
    def __init__(self, settings: LayerFreezingSettings):
        self.layer_names = list(settings.layer_names)

    def on_fit_start(self, state: TrainState):
        params = dict(state.model.named_parameters())
        wanted = {our_name(name, set(params)) for name in self.layer_names}
        unknown = sorted(name for name in self.layer_names if our_name(name, set(params)) not in params)
        if unknown:
            shown = ", ".join(list(params)[:4])
            raise ConfigError(f"callbacks.layer_freezing.layer_names: {unknown} not in the model (its parameters "
                              f"are named like {shown}, ...)")
        frozen = [name for name in wanted if params[name].requires_grad]
        if not frozen:
            raise ConfigError("callbacks.layer_freezing.layer_names: every named parameter is already frozen; "
                              "nothing to freeze")
        for name in frozen:
            params[name].requires_grad_(False)
        state.print(f"layer_freezing: froze {len(frozen)} parameters")


def build_global_lr_scaling(settings: GlobalLRScalingSettings) -> Callback:
    return GlobalLRScaling(settings)


def build_layer_freezing(settings: LayerFreezingSettings) -> Callback:
    return LayerFreezing(settings)
