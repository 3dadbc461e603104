"""The one exception type for bad user input, carrying the config key path and a hint."""

from __future__ import annotations

import difflib
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


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate most similar to ``word``, or None when nothing is close."""
    matches = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """' (did you mean 'x'?)' or '' — to append to an error message."""
    match = closest(word, candidates)
    return f" (did you mean '{match}'?)" if match else ""
