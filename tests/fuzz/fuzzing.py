"""What every fuzz test shares: how many cases to run, running a CLI command in-process, and the rule a run must
obey (exit 0, or exit 2 with a one-line error; never a traceback).

Profiles. CI runs each fuzz test with the small count it names (a few hundred cases in all, derandomized, so a CI
run is reproducible). ``LLMFOUNDRY_FUZZ_EXAMPLES=N`` runs each test with N random cases instead (the slow profile:
``LLMFOUNDRY_FUZZ_EXAMPLES=2000 python -m pytest tests/fuzz``; ``--hypothesis-seed=N`` repeats one such run).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import traceback

from hypothesis import HealthCheck, settings

from llmfoundry import cli

ENV_EXAMPLES = "LLMFOUNDRY_FUZZ_EXAMPLES"


def fuzz_settings(ci_examples: int) -> settings:
    """Hypothesis settings for one fuzz test: ``ci_examples`` derandomized cases, or the slow profile's count."""
    wanted = os.environ.get(ENV_EXAMPLES)
    common = dict(deadline=None, database=None, print_blob=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                         HealthCheck.function_scoped_fixture])
    if wanted:
        return settings(max_examples=int(wanted), **common)
    return settings(max_examples=ci_examples, derandomize=True, **common)


LOG_PREFIX = "log: "  # logged lines (one-line notices) on stderr; not part of the error


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``llmfoundry <argv>`` in this process: (exit code, stdout, stderr). An exception escaping the command (what
    a user would see as a traceback) fails the test with that traceback."""
    out, err = io.StringIO(), io.StringIO()
    # Logging goes to this run's stderr, as in a process of its own: a handler an earlier test installed
    # (logging.basicConfig) may hold a stream pytest has closed since, and logging would print its own traceback.
    root, ours = logging.getLogger(), logging.getLogger("llmfoundry")
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter(LOG_PREFIX + "%(message)s"))
    saved_handlers, root.handlers = root.handlers, [handler]
    saved_ours, ours.handlers = ours.handlers, []
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as stop:  # argparse's own usage errors
            code = stop.code if isinstance(stop.code, int) else 2
        except BaseException:  # noqa: BLE001 - any escape is the failure this suite looks for
            raise AssertionError(f"llmfoundry {' '.join(map(repr, argv))[:300]} raised:\n{traceback.format_exc()}")
        finally:
            root.handlers, ours.handlers = saved_handlers, saved_ours
    return code, out.getvalue(), err.getvalue()


def assert_clean_exit(code: int, out: str, err: str, what: str) -> None:
    """Exit 0, or exit 2 with one line of error on stderr; no traceback anywhere."""
    assert "Traceback (most recent call last)" not in out + err, f"{what}: traceback printed\n{out}\n{err}"
    assert code in (0, 2), f"{what}: exit code {code}\nstdout: {out[-2000:]}\nstderr: {err[-2000:]}"
    lines = [line for line in err.split("\n") if line.strip() and not line.startswith(LOG_PREFIX)]
    if code == 2 and lines:
        # one "error: ..." line; several problems found together follow it as "  - ..." lines (ConfigError.many)
        errors = [line for line in lines if line.startswith("error:")]
        assert len(errors) == 1, f"{what}: expected one 'error:' line on stderr, got:\n{err[-2000:]}"
        after = lines[lines.index(errors[0]) + 1:]
        assert all(line.startswith("  - ") for line in after), f"{what}: more than the error on stderr:\n{err[-2000:]}"
