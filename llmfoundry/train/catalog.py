"""The built-in optimizers (train/optim.py) and algorithms (train/algorithms.py) by name, with their settings.

Builders are named as strings so that checking a recipe imports neither torch nor the optimizers; each is imported
when the trainer builds it (see registry.Registry.declare).
"""

from __future__ import annotations

from llmfoundry.registry import algorithms, optimizers
from llmfoundry.train.algorithm_settings import (
    AlibiSettings,
    GatedLinearUnitsSettings,
    GradientClippingSettings,
    LowPrecisionLayerNormSettings,
)
from llmfoundry.train.optim_settings import (
    AdaLRLionSettings,
    ClipLionSettings,
    DecoupledAdamSettings,
    LionSettings,
    NoOpSettings,
    TorchAdamSettings,
)

OPTIM = "llmfoundry.train.optim"
ALGORITHMS = "llmfoundry.train.algorithms"

optimizers.declare("decoupled_adamw", f"{OPTIM}:build_decoupled_adamw", config=DecoupledAdamSettings)
optimizers.declare("adamw", f"{OPTIM}:build_adamw", config=TorchAdamSettings,
                   differs="llm-foundry has no 'adamw' optimizer (a recipe naming it fails there); here it is "
                   "torch.optim.AdamW (weight decay scaled by lr, unlike decoupled_adamw)")
optimizers.declare("decoupled_lionw", f"{OPTIM}:build_decoupled_lionw", config=LionSettings)
optimizers.declare("clip_lion", f"{OPTIM}:build_clip_lion", config=ClipLionSettings)
optimizers.declare("adalr_lion", f"{OPTIM}:build_adalr_lion", config=AdaLRLionSettings)
optimizers.declare("no_op", f"{OPTIM}:build_no_op", config=NoOpSettings)

algorithms.declare("gradient_clipping", f"{ALGORITHMS}:build_gradient_clipping", config=GradientClippingSettings)
# Composer's model surgery: validation refuses these (their settings' check_settings), so _refuse is never reached.
algorithms.declare("alibi", f"{ALGORITHMS}:_refuse", config=AlibiSettings)
algorithms.declare("gated_linear_units", f"{ALGORITHMS}:_refuse", config=GatedLinearUnitsSettings)
algorithms.declare("low_precision_layernorm", f"{ALGORITHMS}:_refuse", config=LowPrecisionLayerNormSettings)
