"""``model.activation_checkpointing_target``: which modules of the MPT blocks are recomputed in backward.

llm-foundry's meaning, kept exactly (it applies when ``fsdp_config.activation_checkpointing`` is true):

* null or ``[]``: every ``MPTBlock``;
* a name or a list of names: those modules in every block (two different names would put a block under two
  targets, which llm-foundry rejects, and so does validation here);
* a mapping ``{name: blocks}``: ``blocks`` is n (the first n blocks), a list of block ids and/or
  ``first-n``, ``last-k``, ``middle-m``, ``range-i-j`` strings, or such strings joined by commas.

Names: ``mptblock``, an attention type (``grouped_query_attention`` matches every attention module, as the
other two are its subclasses in llm-foundry), an FFN type (``mptmlp`` also matches ``mptglu``) or a norm type
(``layernorm`` / ``rmsnorm`` also match their low-precision flavours). A module is decided by the first name
that matches it. This module parses and checks the key (for the recipe schema, without torch); ``act_ckpt.py``
marks the chosen modules.
"""

from __future__ import annotations

from typing import Any

ATTENTION_NAMES = ("multihead_attention", "multiquery_attention", "grouped_query_attention")
TARGET_NAMES = ("mptblock", *ATTENTION_NAMES, "mptmlp", "mptglu", "layernorm", "low_precision_layernorm",
                "rmsnorm", "low_precision_rmsnorm")
KEY = "activation_checkpointing_target"


def _canonical(name: str) -> str:
    return "mptblock" if name.lower() == "mptblock" else name


def _block_ids(spec: Any, n_blocks: int, where: str) -> list[int]:
    """llm-foundry's target_blocks: n, [ids and/or strings], or 'first-n, last-k, middle-m, range-i-j'."""
    last = n_blocks - 1
    if isinstance(spec, bool) or not isinstance(spec, (int, str, list)):
        raise ValueError(f"{where}: block selection must be n, a list of block ids / 'first-n', 'last-k', "
                         f"'middle-m', 'range-i-j' strings, or such strings joined by commas; got {spec!r}")
    if isinstance(spec, int):
        return list(range(spec))
    items = spec.replace(" ", "").split(",") if isinstance(spec, str) else spec
    ids: list[int] = []
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool):
            ids.append(item)
            continue
        kind, _, rest = str(item).partition("-")
        numbers = rest.split("-")
        if kind not in ("first", "last", "middle", "range") or not all(n.isdigit() for n in numbers) or \
                len(numbers) != (2 if kind == "range" else 1):
            raise ValueError(f"{where}: '{item}' is not a block id or one of first-n, last-k, middle-m, range-i-j")
        n = int(numbers[0])
        if kind == "first":
            ids += range(min(n, last + 1))
        elif kind == "last":
            ids += range(max(last - n + 1, 0), last + 1)
        elif kind == "middle":
            start = max(last // 2 - n // 2, 0)
            ids += range(start, min(start + n, last + 1))
        else:
            ids += range(max(n, 0), min(int(numbers[1]), last + 1))
    return sorted(set(ids))


def parse_target(target: Any, n_blocks: int, prefix: str = "model") -> list[tuple[str, list[int] | None]]:
    """[(name, block ids or None for all)], in order; raises ValueError with a one-line message."""
    where = f"{prefix}.{KEY}"
    if target is None or target == []:
        mapping: list[tuple[str, list[int] | None]] = [("mptblock", None)]
    elif isinstance(target, str):
        mapping = [(_canonical(target), None)]
    elif isinstance(target, list):
        mapping = [(_canonical(str(name)), None) for name in dict.fromkeys(target)]
    elif isinstance(target, dict):
        mapping = [(_canonical(str(name)), _block_ids(spec, n_blocks, f"{where}.{name}"))
                   for name, spec in target.items()]
    else:
        raise ValueError(f"{where}: a module name, a list of names or a mapping name -> blocks, got {target!r}")
    for name, _ in mapping:
        if name not in TARGET_NAMES:
            raise ValueError(f"{where}: '{name}' is not a module name (use one of {', '.join(TARGET_NAMES)})")
    owner: dict[int, str] = {}
    for name, ids in mapping:  # llm-foundry refuses a block that two targets claim
        for i in range(n_blocks) if ids is None else ids:
            if 0 <= i < n_blocks and owner.setdefault(i, name) != name:
                raise ValueError(f"{where}: block {i} is assigned to both {name} and {owner[i]} (give each "
                                 "block one target, e.g. a mapping name -> blocks)")
    return mapping


def target_problems(target: Any, n_blocks: int, prefix: str = "model") -> list[str]:
    try:
        parse_target(target, n_blocks, prefix)
    except ValueError as e:
        return [str(e)]
    return []
