"""One-line notices: a setting that llm-foundry would honour differently (or not at all) is said once per run.

A notice is logged (logger ``llmfoundry``, level WARNING) by rank 0 only, and only the first time its text is
seen in the process, so that a per-block or per-step caller still prints it once.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("llmfoundry")
_seen: set[str] = set()


def notice_once(message: str) -> bool:
    """Log ``message`` (one line naming the key) unless it was already said; returns whether it was logged."""
    if message in _seen:
        return False
    _seen.add(message)
    if _rank() != 0:
        return False
    log.warning(message)
    return True


def _rank() -> int:
    """The process group's rank once there is one, else torchrun's ``RANK`` (a notice raised while the recipe is
    validated, before the group exists, is said by rank 0 only too). torch is never imported here: checking a
    recipe must not load it, and a process group exists only where torch was loaded already."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        return distributed.get_rank()
    return int(os.environ.get("RANK") or 0)
