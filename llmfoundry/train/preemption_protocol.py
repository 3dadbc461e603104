"""What the trainer, the recipe schema and the launchers' scripts agree on about a stop (train/preemption.py does
the stopping): exit codes, the environment variables they exchange, and how a signal or a wall-clock margin is
written. Free of torch, so a recipe is checked and a Slurm script is written without loading it."""

from __future__ import annotations

import re
import signal

REQUEUE_EXIT_CODE = 75  # EX_TEMPFAIL: "try again later"; the Slurm batch script requeues on it
CANCEL_EXIT_CODE = 143  # 128 + SIGTERM, what a process killed by SIGTERM reports
FLAG_FILE_ENV = "LLMFOUNDRY_PREEMPT_FILE"
EXIT_FILE_ENV = "LLMFOUNDRY_EXIT_FILE"
END_TIME_ENVS = ("SLURM_JOB_END_TIME", "LLMFOUNDRY_JOB_END_TIME")  # the job's end, in seconds since the epoch
_WALLCLOCK = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|hr)?\s*$")
_UNIT_SECONDS = {None: 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600}


def parse_wallclock(value: str | float) -> float:
    """Seconds of a wall-clock duration: 300, '300s', '5m', '1.5h'."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _WALLCLOCK.match(str(value))
        if match is None:
            raise ValueError(f"'{value}' is not a duration (use seconds, or e.g. '300s', '10m', '1h')")
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"'{value}' must be more than 0 seconds")
    return seconds


def signal_number(name: str) -> int:
    """signal.SIGUSR2 for 'SIGUSR2' or 'USR2'."""
    full = name.upper() if name.upper().startswith("SIG") else f"SIG{name.upper()}"
    number = getattr(signal, full, None)
    if not isinstance(number, signal.Signals):
        raise ValueError(f"'{name}' is not a signal of this system (e.g. SIGUSR2, SIGUSR1, SIGINT)")
    return int(number)


def job_end_time(environ) -> float | None:
    for key in END_TIME_ENVS:
        text = environ.get(key, "").strip()
        if text.isdigit() and int(text) > 0:
            return float(text)
    return None
