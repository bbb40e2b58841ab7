"""The ``plan`` command line: parse, dispatch to a command module, print, exit.

Every user-facing failure is a `PlannerError`; it is printed as one line on stderr and
the process exits with the error's code (see README, "Exit codes"). ``--debug`` shows the
traceback instead.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, NoReturn, Sequence

from costmodel.errors import InvalidConfigError, PlannerError, TimeLimitError
from planner.commands import compare_cmd, inspect_cmd, plan_cmd, simulate_cmd, validate_cmd

# Each command module offers add_arguments(parser) and run(args) -> int.
_COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "layout": ("choose a layout (the default command: plan --model M --mesh 8x4)", plan_cmd.add_arguments, plan_cmd.run),
    "inspect": ("parameter count, FLOPs and graph size of a model", inspect_cmd.add_arguments, inspect_cmd.run),
    "simulate": ("predict step time and memory of one layout", simulate_cmd.add_arguments, simulate_cmd.run),
    "validate": ("compile a plan on its (emulated) device mesh and compare", validate_cmd.add_arguments, validate_cmd.run),
    "compare": ("the ILP and the search planners on one strategy space, side by side", compare_cmd.add_arguments,
                compare_cmd.run),
}

# --time-limit-s of the commands that do not define their own: wall seconds for the whole command.
# `plan layout` defines it for its searches (each stops there and keeps the best layout found);
# the command as a whole then gets twice that, for the two searches, plus _TRACE_S for tracing.
_TIME_LIMIT_S = {"inspect": 120.0, "simulate": 60.0, "validate": 1800.0, "compare": 1800.0}
_TRACE_S = 60.0


class _WallClock(BaseException):
    """Raised by the time-limit alarm; a BaseException, so no library ``except Exception`` swallows it."""


class _Parser(argparse.ArgumentParser):
    """Usage errors in the catalog's one-line form (exit 2); subcommand parsers inherit it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"plan: error: {message}; fix: see `{self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for ``plan <command> ...``."""
    parser = _Parser(prog="plan", description="Plan, simulate and validate parallel layouts for JAX training.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, add_arguments, _) in _COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(command)
        if name in _TIME_LIMIT_S:
            command.add_argument("--time-limit-s", type=float, default=_TIME_LIMIT_S[name],
                                 help=f"stop after this many wall seconds with exit code 6 (default {_TIME_LIMIT_S[name]:g})")
    return parser


def wall_limit_s(args: argparse.Namespace) -> float:
    """Seconds the whole command may run: its --time-limit-s, or for `plan layout` (whose searches
    stop at that limit and keep their best) twice it plus time to trace the model.

    >>> wall_limit_s(argparse.Namespace(command="layout", time_limit_s=20.0)), wall_limit_s(argparse.Namespace(command="simulate", time_limit_s=5.0))
    (100.0, 5.0)
    """
    limit_s = args.time_limit_s
    if not (isinstance(limit_s, float) and 0 < limit_s < math.inf):
        raise InvalidConfigError(f"--time-limit-s={limit_s} is not a positive number of seconds", fix="e.g. --time-limit-s 20")
    return 2 * limit_s + _TRACE_S if args.command == "layout" else limit_s


@contextmanager
def _alarm(limit_s: float) -> Iterator[None]:
    """Raise `_WallClock` in this (main) thread after ``limit_s`` wall seconds; a subprocess being
    waited on is killed by `subprocess.run` as the exception passes."""
    def expire(signum: int, frame: object) -> None:
        raise _WallClock

    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    previous = signal.signal(signal.SIGALRM, expire)
    try:
        signal.setitimer(signal.ITIMER_REAL, limit_s)
        yield
    finally:
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
        finally:
            signal.signal(signal.SIGALRM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``plan`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # `plan --model M --mesh 8x4` is `plan layout ...`: the command name may be left out.
    first = next((a for a in argv if a != "--debug"), None)
    if first is not None and first not in _COMMANDS and first not in ("-h", "--help"):
        argv.insert(argv.index(first), "layout")
    args = build_parser().parse_args(argv)
    try:
        limit_s = wall_limit_s(args)
        try:
            with _alarm(limit_s):
                return _COMMANDS[args.command][2](args)
        except _WallClock:
            name = "plan" if args.command == "layout" else f"plan {args.command}"
            raise TimeLimitError(f"{name} ran past its time limit of {limit_s:g} s with no answer",
                                 fix="raise --time-limit-s") from None
    except PlannerError as err:
        if args.debug:
            raise
        print(f"plan: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("plan: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
