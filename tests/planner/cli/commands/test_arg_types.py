"""Tests `planner/cli/commands/arg_types.py`: every numeric flag of every `plan` command refuses nonsense
with one line and exit 2. The flags are read from the argparse parsers, so a new flag is covered."""

import argparse
import os
import subprocess
import sys

import pytest

from planner.cli.commands.arg_types import (
    NUMERIC_TYPES,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    positive_int_or_auto,
    positive_int_or_none,
    probability,
)
from planner.cli.main import build_parser, main

BAD_VALUES = {
    positive_int: ("0", "-1", "1.5", "nan", "inf", "1e3", "eight"),
    positive_int_or_auto: ("0", "-1", "1.5", "nan", "Auto", "eight"),
    positive_int_or_none: ("0", "-1", "1.5", "None", "eight"),
    probability: ("-0.1", "1.5", "nan", "inf", "half"),
    non_negative_int: ("-1", "1.5", "nan", "inf", "seed"),
    positive_float: ("0", "-0.5", "nan", "inf", "-inf", "ten"),
    non_negative_float: ("-0.5", "nan", "inf", "-inf", "four"),
}


def _command_parsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _is_numeric(action: argparse.Action) -> bool:
    numeric_default = isinstance(action.default, (int, float)) and not isinstance(action.default, bool)
    return action.type in NUMERIC_TYPES or action.type in (int, float) or (numeric_default and action.nargs != 0)


def _numeric_flags() -> list[tuple[str, str, object]]:
    return [(command, action.option_strings[-1], action.type) for command, parser in _command_parsers().items()
            for action in parser._actions if action.option_strings and _is_numeric(action)]


def test_every_numeric_flag_uses_a_validating_type():
    flags = _numeric_flags()
    assert {command for command, _, _ in flags} == set(_command_parsers())  # every command has some
    raw = [(command, flag, t) for command, flag, t in flags if t not in NUMERIC_TYPES]
    assert not raw, f"numeric flags parsed without a validating type from planner/cli/commands/arg_types.py: {raw}"


@pytest.mark.parametrize("command, flag, kind", _numeric_flags(), ids=lambda v: getattr(v, "__name__", v))
def test_nonsense_value_is_one_line_and_exit_2(capsys, command, flag, kind):
    for bad in BAD_VALUES[kind]:
        with pytest.raises(SystemExit) as exit_:
            main([command, f"{flag}={bad}"])
        err = capsys.readouterr().err
        assert exit_.value.code == 2, (flag, bad)
        assert err.count("\n") == 1 and err.startswith(f"plan: error: argument {flag}: {bad!r}") and "; fix: " in err, err
        assert "Traceback" not in err


def test_the_reported_seq_len_zero_is_refused_by_the_console_command():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-m", "planner.cli", "--model", "llama3-8b", "--mesh", "2x2", "--seq-len", "0"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("plan: error: argument --seq-len: '0' is not a positive whole number; "
                           "fix: give a whole number of at least 1, e.g. 8\n")


def test_good_values_parse_to_numbers():
    assert positive_int("8") == 8 and non_negative_int("0") == 0 and positive_float("15e12") == 15e12
