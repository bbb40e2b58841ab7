"""``--time-limit-s`` for every command: a wall-clock limit after which the CLI answers exit 6.

`plan` (``layout``) defines the flag for its searches, which stop at the limit and keep the
best layout found (``solver.status`` FEASIBLE); the whole command then gets twice that (layout
search, then intra-op planner) plus `TRACE_S` to trace the model. The other commands get the
flag here, with `DEFAULT_S`, and stop as a whole at it.

>>> wall_limit_s("layout", 20.0), wall_limit_s("simulate", 5.0)
(100.0, 5.0)
"""

from __future__ import annotations

import argparse
import math
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

from costmodel.errors import InvalidConfigError, TimeLimitError
from planner.cli.commands.arg_types import positive_float

DEFAULT_S = {"inspect": 120.0, "hardware": 60.0, "simulate": 60.0, "serve": 300.0,
             "validate": 1800.0, "compare": 1800.0, "largest": 300.0, "budget": 300.0}
TRACE_S = 60.0


class _WallClock(BaseException):
    """Raised by the alarm; a BaseException, so no library ``except Exception`` swallows it."""


def add_time_limit(parser: argparse.ArgumentParser, command: str) -> None:
    """Give ``command``'s parser ``--time-limit-s`` unless the command defines its own."""
    if command in DEFAULT_S:
        parser.add_argument("--time-limit-s", type=positive_float, default=DEFAULT_S[command],
                            help=f"stop after this many wall seconds with exit code 6 (default {DEFAULT_S[command]:g})")


def wall_limit_s(command: str, time_limit_s: float) -> float:
    """Seconds the whole command may run; a limit that is not a positive finite number is an error."""
    if not (isinstance(time_limit_s, float) and 0 < time_limit_s < math.inf):
        raise InvalidConfigError(f"--time-limit-s={time_limit_s} is not a positive number of seconds", fix="e.g. --time-limit-s 20")
    return 2 * time_limit_s + TRACE_S if command == "layout" else time_limit_s


@contextmanager
def time_limit(command: str, limit_s: float) -> Iterator[None]:
    """Raise `TimeLimitError` (exit 6) if the block runs past ``limit_s`` wall seconds.

    SIGALRM interrupts the main thread between bytecodes; a subprocess being waited on is killed
    by `subprocess.run` as the exception passes. Off the main thread (no signals) there is no limit.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise _WallClock

    previous = signal.signal(signal.SIGALRM, expire)
    try:
        signal.setitimer(signal.ITIMER_REAL, limit_s)
        yield
    except _WallClock:
        name = "plan" if command == "layout" else f"plan {command}"
        raise TimeLimitError(f"{name} ran past its time limit of {limit_s:g} s with no answer", fix="raise --time-limit-s") from None
    finally:
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
        finally:
            signal.signal(signal.SIGALRM, previous)
