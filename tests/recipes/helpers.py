"""Constants shared by the recipe tests and their fixtures: the tiny shape every shipped recipe is shrunk to."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import TINY_RECIPE_SEQ

REPO = Path(__file__).resolve().parents[2]

TINY_SEQ = 128  # model and finetuning rows (chat markup is long in the 512-token test vocabulary)
MDS_SEQ = TINY_RECIPE_SEQ  # tokens per pretraining sample in the shared ``mds_root`` fixture
TINY_MPT = {"d_model": 32, "n_heads": 2, "n_layers": 2, "expansion_ratio": 2, "max_seq_len": TINY_SEQ, "vocab_size": 512}
# what the TINY_MPT overrides add to a recipe whose model sets these keys (MoE recipes): a per-expert FFN width of
# the tiny dense FFN's, and key/value heads that divide TINY_MPT's n_heads (grouped-query attention stays on)
TINY_FFN_HIDDEN = TINY_MPT["d_model"] * TINY_MPT["expansion_ratio"]
TINY_KV_HEADS = 1
TINY_EXPERT_PARALLEL = 2  # ranks a recipe with moe_world_size > 1 runs on (its experts split over them)
