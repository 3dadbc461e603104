"""Slurm's compressed host lists (``node[07-08,10]``, ``a[1-2]-ib,b3``) and task counts (``2(x3),1``)."""

from __future__ import annotations

import re

_COUNT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _split_top_level(text: str) -> list[str]:
    """Split at commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list '{text}'")
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced '[' in host list '{text}'")
    parts.append(text[start:])
    return [p for p in parts if p]


def _expand_range(spec: str, text: str) -> list[str]:
    """``07-08,10`` -> ['07', '08', '10'] (zero padding kept, as Slurm does)."""
    out = []
    for item in spec.split(","):
        low, _, high = item.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"bad range '{item}' in host list '{text}'")
        if not high:
            out.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"descending range '{item}' in host list '{text}'")
        width = len(low) if low.startswith("0") else 0
        out += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return out


def _expand_host(pattern: str, text: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", pattern)
    if match is None:
        return [pattern]
    head, tail = pattern[:match.start()], pattern[match.end():]
    return [head + value + rest for value in _expand_range(match.group(1), text) for rest in _expand_host(tail, text)]


def expand_hostlist(text: str) -> list[str]:
    """Every host name of a Slurm host list, in order: ``node[07-08,10]`` -> node07, node08, node10."""
    return [host for part in _split_top_level(text.strip()) for host in _expand_host(part, text)]


def expand_counts(text: str) -> list[int]:
    """Slurm's per-node counts (SLURM_TASKS_PER_NODE, SLURM_JOB_CPUS_PER_NODE): ``2(x3),1`` -> [2, 2, 2, 1]."""
    out: list[int] = []
    for part in text.strip().split(","):
        match = _COUNT.match(part.strip())
        if match is None:
            raise ValueError(f"bad count '{part}' in '{text}' (expected N or N(xM))")
        out += [int(match.group(1))] * int(match.group(2) or 1)
    return out
