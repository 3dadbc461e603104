"""`llmfoundry plan`'s proposals: the changes to a recipe that make it fit or train faster (microbatch, activation
checkpointing, sharding strategy, tensor-parallel degree), each checked by the same estimate (train/plan.py)."""

from __future__ import annotations

import dataclasses

from llmfoundry.core.errors import ConfigError
from llmfoundry.train.plan import Choice, Estimate, Planner
from llmfoundry.train.settings import TPConfig


def checkpointing_candidates(planner: Planner, c: Choice) -> list[tuple[str, Choice]]:
    """The other activation checkpointing settings, as the overrides that choose them."""
    fsdp = planner.cfg.fsdp_config
    if fsdp is None:
        return []
    on = "" if c.checkpointing else "fsdp_config.activation_checkpointing=true "
    out = []
    if c.checkpointing is not None:
        out.append(("fsdp_config.activation_checkpointing=false", dataclasses.replace(c, checkpointing=None)))
    if c.checkpointing != "full":
        mode = "" if c.checkpointing is None else "fsdp_config.activation_checkpointing_mode=full"
        out.append(((on + mode).strip(), dataclasses.replace(c, checkpointing="full")))
    if c.checkpointing != "selective_op":
        # the per-op policy needs the non-reentrant implementation (activation_ckpt.checkpoint_modules)
        plain = " fsdp_config.activation_checkpointing_reentrant=false" if fsdp.activation_checkpointing_reentrant else ""
        out.append((f"{on}fsdp_config.activation_checkpointing_mode=selective_op{plain}",
                    dataclasses.replace(c, checkpointing="selective_op")))
    return out


def tensor_parallel_candidates(planner: Planner, c: Choice, fits: bool) -> list[tuple[str, Choice, Planner]]:
    """Half (integer division: 3 -> 1) and twice the recipe's TP degree (twice: within a node; without tp_config, 2 only when the recipe does
    not fit), each a Planner of its own sharing the fake runs: a degree the model or the layout cannot take (heads,
    FFN width, world size, fsdp_config) is left out, as the trainer would refuse it."""
    cfg = planner.cfg
    tp = cfg.tp_config if cfg.tp_config is not None else TPConfig()
    degree = tp.tensor_parallel_degree
    options = [degree // 2] if degree > 1 else []
    if (degree > 1 or not fits) and degree * 2 <= planner.gpus_per_node and planner.world % (degree * 2) == 0:
        options.append(degree * 2)
    out = []
    for new in options:
        changed = dataclasses.replace(cfg, tp_config=dataclasses.replace(tp, tensor_parallel_degree=new))
        try:
            other = Planner(changed, planner.nodes, planner.gpus_per_node, planner.gpu, planner.measured)
        except ConfigError:
            continue
        out.append((f"tp_config.tensor_parallel_degree={new}", c, other))
    return out


def proposals(planner: Planner, base: Estimate, candidates: list | None = None) -> list[tuple[str, Estimate]]:
    """Changes that make the recipe fit, or run faster while fitting; each is a full estimate. ``candidates``: the
    changes to check (the override that makes each, its choice, optionally the Planner of a changed recipe); by
    default every kind plan knows, below."""
    if candidates is not None:
        return _checked(planner, base, candidates)
    c = base.choice
    candidates = checkpointing_candidates(planner, c)
    for micro in (c.micro // 2, c.micro * 2):
        if 1 <= micro <= planner.device_batch and planner.device_batch % micro == 0 and micro != c.micro:
            candidates.append((f"device_train_microbatch_size={micro}", dataclasses.replace(c, micro=micro)))
    if c.strategy == "SHARD_GRAD_OP":
        candidates.append(("fsdp_config.sharding_strategy=FULL_SHARD", dataclasses.replace(c, strategy="FULL_SHARD")))
    elif c.strategy == "FULL_SHARD" and planner.world > planner.gpus_per_node and planner.tp == 1:
        # (the trainer runs TP with FULL_SHARD or SHARD_GRAD_OP only: layouts.FSDP_WITH_TP)
        candidates.append(("fsdp_config.sharding_strategy=HYBRID_SHARD",
                           dataclasses.replace(c, strategy="HYBRID_SHARD")))
    candidates += tensor_parallel_candidates(planner, c, base.fits)
    return _checked(planner, base, candidates)


def _checked(planner: Planner, base: Estimate, candidates: list) -> list[tuple[str, Estimate]]:
    """The candidates that make the recipe fit, or keep it fitting and are faster, fastest first."""
    out: list[tuple[str, Estimate]] = []
    for change, choice, *other in candidates:
        try:
            est = (other[0] if other else planner).estimate(choice)
        except ConfigError:
            continue
        if (not base.fits and est.fits) or (est.fits and est.step_s < base.step_s * 0.98):
            out.append((change, est))
    out.sort(key=lambda item: (not item[1].fits, item[1].step_s))
    return out
