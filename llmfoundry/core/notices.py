"""One-line notices: a setting that llm-foundry would honour differently (or not at all) is said once per run.

A notice is logged (logger ``llmfoundry``, level WARNING) by rank 0 only, and only the first time its text is
seen in the process, so that a per-block or per-step caller still prints it once.
"""

from __future__ import annotations

import logging

from llmfoundry.core import dist

log = logging.getLogger("llmfoundry")
_seen: set[str] = set()


def notice_once(message: str) -> bool:
    """Log ``message`` (one line naming the key) unless it was already said; returns whether it was logged."""
    if message in _seen:
        return False
    _seen.add(message)
    if dist.rank() != 0:
        return False
    log.warning(message)
    return True
