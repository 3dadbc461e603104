"""The one exception type for bad user input, carrying the config key path and a hint."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable


class ConfigError(ValueError):
    """A problem with what the user asked for: a config key, a file, a flag.

    The CLI prints ``str(error)`` (one line per problem) and exits with code 2, with no traceback.
    Raise it with the key path first: ``ConfigError("model.n_heads: expected an int, got 'x'")``.
    Several problems found together go in one error: ``ConfigError.many([...])``.
    """

    def __init__(self, message: str, problems: list[str] | None = None):
        self.problems = problems if problems is not None else [message]
        super().__init__(message)

    @classmethod
    def many(cls, problems: list[str]) -> "ConfigError":
        if len(problems) == 1:
            return cls(problems[0])
        header = f"{len(problems)} problems in the config:"
        return cls("\n".join([header] + [f"  - {p}" for p in problems]), problems)

    def rekeyed(self, old: str, new: str) -> "ConfigError":
        """The same problems reported under key ``new``: a problem about ``old`` (e.g. a helper's ``load_path``)
        gets ``new`` as its prefix, any other is put under ``new``."""
        return ConfigError.many([new + p[len(old):] if p.startswith(old) else f"{new}: {p}" for p in self.problems])


class CollectiveError(RuntimeError):
    """A collective that did not complete: another rank stopped, or it waited past ``dist_timeout``. The message is
    one line naming this rank and the operation; the CLI prints it without a traceback and exits with code 1."""


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (its type's name when the message is empty), for one-line errors
    that quote what a library said."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate most similar to ``word``, or None when nothing is close."""
    matches = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """' (did you mean 'x'?)' or '' — to append to an error message."""
    match = closest(word, candidates)
    return f" (did you mean '{match}'?)" if match else ""


def refusal_reason(error: BaseException) -> str:
    """What torch's ``weights_only`` unpickler refused, in a few words (its message runs to a page)."""
    found = re.search(r"unsupported global:? GLOBAL ([\w.]+)", str(error), re.IGNORECASE)
    if found:
        return f"it needs '{found.group(1)}', which is not allowed"
    return first_line(error)[:200]
