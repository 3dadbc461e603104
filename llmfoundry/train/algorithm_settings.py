"""The ``algorithms.<name>`` section of each algorithm in train/algorithms.py, kept apart from torch so that checking
a recipe imports neither (train/catalog.py pairs each name with its settings).

Composer's model-surgery algorithms (alibi, gated_linear_units, low_precision_layernorm) are model keys here: their
settings accept Composer's keys and their check says which model key to set instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from llmfoundry.config.fields import option


@dataclass
class GradientClippingSettings:
    clipping_type: Literal["norm", "value", "adaptive"] = option(
        "norm", "norm = clip the global gradient norm; value = clip each gradient element (under FSDP, as Composer: "
        "scale all gradients so the largest magnitude is the threshold); adaptive = clip each unit's gradient norm "
        "to clipping_threshold times its weight norm (AGC)"
    )
    clipping_threshold: float = option(1.0, "the maximum norm, absolute value, or gradient/weight norm ratio")


SURGERY = {
    "alibi": "model.attn_config.alibi: true",
    "gated_linear_units": "model.ffn_config.ffn_type: mptglu (model.ffn_config.ffn_act_fn picks the gate)",
    "low_precision_layernorm": "model.norm_type: low_precision_layernorm",
}


class _Surgery:
    """Composer's model-surgery algorithms: their keys are accepted so that the error below is the one reported."""

    def check_settings(self, path: str) -> list[str]:
        name = path.rsplit(".", 1)[-1]
        return [f"{path}: Composer's model surgery is not done here: remove it and, on mpt_causal_lm, set "
                f"{SURGERY[name]} (an hf_causal_lm model cannot be changed: use mpt_causal_lm with that key)"]


@dataclass
class AlibiSettings(_Surgery):
    max_sequence_length: Any = option(None, "Composer's key (refused with the algorithm)")
    train_sequence_length_scaling: Any = option(None, "Composer's key (refused with the algorithm)")


@dataclass
class GatedLinearUnitsSettings(_Surgery):
    act_fn: Any = option(None, "Composer's key (refused with the algorithm)")
    gated_layer_bias: Any = option(None, "Composer's key (refused with the algorithm)")
    non_gated_layer_bias: Any = option(None, "Composer's key (refused with the algorithm)")


@dataclass
class LowPrecisionLayerNormSettings(_Surgery):
    apply_at_fit_start: Any = option(None, "Composer's key (refused with the algorithm)")
