"""The ``plan`` command line: parse, dispatch to a command module, print, exit.

Every user-facing failure is a `PlannerError`; it is printed as one line on stderr and
the process exits with the error's code (see docs/commands.md, "Exit codes"). ``--debug`` shows the
traceback instead. Every command runs under its ``--time-limit-s`` (`planner.cli.time_limit`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType
from typing import Collection, NoReturn, Sequence

from costmodel.errors import PlannerError
from planner.cli.time_limit import add_time_limit, time_limit, wall_limit_s

# Command → (help, the module that offers add_arguments(parser) and run(args) -> int). A module
# loads only when its command runs (or its --help shows): `plan simulate` never loads the planner,
# the validator or JAX.
_COMMANDS: dict[str, tuple[str, str]] = {
    "layout": ("choose a layout (the default command: plan --model M --mesh 8x4)", "plan_cmd"),
    "inspect": ("parameter count, FLOPs and graph size of a model", "inspect_cmd"),
    "hardware": ("which dtypes each part accelerates and at what peak (the --precision it runs)", "hardware_cmd"),
    "simulate": ("predict step time and memory of one layout", "simulate_cmd"),
    "serve": ("the layout that serves a request rate within latency targets: continuous batching simulated", "serve_cmd"),
    "validate": ("compile a plan on its (emulated) device mesh and compare", "validate_cmd"),
    "largest": ("the largest model of a family whose training step fits the devices", "largest_cmd"),
    "budget": ("the compute-optimal model size and tokens for a device budget (Chinchilla rule)", "budget_cmd"),
    "compare": ("the ILP and the search planners on one strategy space, side by side", "compare_cmd"),
}


def _command_module(name: str) -> ModuleType:
    return importlib.import_module(f"planner.cli.commands.{_COMMANDS[name][1]}")


class _Parser(argparse.ArgumentParser):
    """Usage errors in the catalog's one-line form (exit 2); subcommand parsers inherit it."""

    def error(self, message: str) -> NoReturn:
        fix = "" if "; fix: " in message else f"; fix: see `{self.prog} --help`"  # a type helper names its own fix
        self.exit(2, f"plan: error: {message}{fix}\n")


def build_parser(commands: Collection[str] = tuple(_COMMANDS)) -> argparse.ArgumentParser:
    """The argument parser for ``plan <command> ...``, with the flags of ``commands`` (every
    command still lists with its help)."""
    parser = _Parser(prog="plan", description="Plan, simulate and validate parallel layouts for JAX training.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, _) in _COMMANDS.items():
        parser_of_command = sub.add_parser(name, help=help_text, description=help_text)
        if name in commands:
            _command_module(name).add_arguments(parser_of_command)
        add_time_limit(parser_of_command, name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``plan`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # `plan --model M --mesh 8x4` is `plan layout ...`: the command name may be left out.
    first = next((a for a in argv if a != "--debug"), None)
    if first is not None and first not in _COMMANDS and first not in ("-h", "--help"):
        argv.insert(argv.index(first), "layout")
    chosen = next((a for a in argv if a != "--debug"), None)
    args = build_parser([chosen] if chosen in _COMMANDS else []).parse_args(argv)
    try:
        with time_limit(args.command, wall_limit_s(args.command, args.time_limit_s)):
            return _command_module(args.command).run(args)
    except PlannerError as err:
        if args.debug:
            raise
        # One line whatever a message quotes from the user (a file name or key with a newline in it).
        print(f"plan: error: {err}".replace("\r", "\\r").replace("\n", "\\n"), file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("plan: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
