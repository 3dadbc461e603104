"""Tables from callbacks (generations, eval outputs) for the loggers.

A logger records a table when it has ``log_table(columns, rows, name, step)`` (Composer's signature). When none of
the run's loggers has one, the table goes to the console instead, with a notice saying so once.
"""

from __future__ import annotations

from typing import Any

from llmfoundry.core.notices import notice_once


def log_table(state: Any, name: str, columns: list[str], rows: list[list[Any]], key: str) -> int:
    """Hand the table to every logger that records tables (rank 0 holds the loggers); returns how many took it."""
    taken = 0
    state.flush_metrics()  # the batches' metrics queued since the last log interval go first: steps stay in order
    for logger in state.loggers:
        record = getattr(logger, "log_table", None)
        if callable(record):
            record(columns, rows, name=name, step=state.time.batch)
            taken += 1
    if state.dist.is_main and not taken:
        notice_once(f"{key}: none of the run's loggers records tables; they are printed to the console")
        state.print(format_table(name, columns, rows))
    return taken


def format_table(name: str, columns: list[str], rows: list[list[Any]]) -> str:
    lines = [f"[{name}]", " | ".join(columns)]
    lines += [" | ".join(str(value).replace("\n", "\\n") for value in row) for row in rows]
    return "\n".join(lines)
