"""The one error hierarchy every package raises for user-facing failures.

Each error carries a one-line cause and, where there is one, the nearest fix; the CLI
prints ``str(err)`` and exits with ``err.exit_code`` (no traceback unless ``--debug``).

>>> str(InvalidConfigError("num_attention_heads=7 does not divide hidden_size=64",
...                        fix="use a head count that divides hidden_size"))
'num_attention_heads=7 does not divide hidden_size=64; fix: use a head count that divides hidden_size'
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Sequence

from pydantic import ValidationError


class PlannerError(Exception):
    """Base of every error a user can cause; ``exit_code`` is the CLI's exit status."""

    exit_code = 1

    def __init__(self, cause: str, *, fix: str | None = None) -> None:
        super().__init__(cause)
        self.cause = cause
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.cause}; fix: {self.fix}" if self.fix else self.cause


class InvalidConfigError(PlannerError):
    """A model, training, hardware or mesh description is malformed or inconsistent."""

    exit_code = 2


class InvalidPlanError(PlannerError):
    """A layout or plan contradicts the model, mesh or device count."""

    exit_code = 3


class InfeasibleError(PlannerError):
    """No candidate satisfies the constraints (memory, divisibility, time limit)."""

    exit_code = 4


class TimeLimitError(InfeasibleError):
    """The time limit ran out before any answer was found (``--time-limit-s``)."""

    exit_code = 6


class UnsupportedError(PlannerError):
    """The input is valid but asks for something this tool does not model."""

    exit_code = 5


def unknown_name_error(what: str, name: str, known: Sequence[str], *, otherwise: str = "") -> InvalidConfigError:
    """The one error for a name that is none of ``known``: the closest known names first ("did you
    mean", by `difflib.get_close_matches`), then every choice; ``otherwise`` names another way in.

    >>> print(unknown_name_error("model", "lama3-8b", ["gpt2", "llama3-8b"], otherwise="a config.json path or "))
    unknown model 'lama3-8b'; fix: did you mean 'llama3-8b'? Otherwise use a config.json path or one of: gpt2, llama3-8b
    >>> print(unknown_name_error("stack", "xyz", ["jax", "maxtext"]))
    unknown stack 'xyz'; fix: use one of: jax, maxtext
    """
    close = difflib.get_close_matches(name, known, n=3)
    choices = f"use {otherwise}one of: {', '.join(known)}"
    return InvalidConfigError(f"unknown {what} {name!r}",
                              fix=f"did you mean {', '.join(map(repr, close))}? Otherwise {choices}" if close else choices)


def first_problem(err: ValidationError) -> tuple[str, str, Any]:
    """(dotted field location, message, offending input) of the first problem pydantic found; a field
    reported missing comes after any other problem, which may be why it is missing (a derived default)."""
    first = min(err.errors(), key=lambda e: e["type"] == "missing")
    where = ".".join(str(p) for p in first["loc"])
    return where if where.isprintable() else repr(where), first["msg"], first.get("input")  # a key from a file may hold "\n"


def flag_error(err: ValidationError, error_type: type[PlannerError] = InvalidConfigError) -> PlannerError:
    """A validation error on command-line values, named by the flag (``--seq-len=0: ...``)."""
    where, msg, value = first_problem(err)
    flag = "--" + where.split(".")[0].replace("_", "-")
    return error_type(f"{flag}={value!r}: {msg}", fix=f"give a valid {flag}")


MAX_FILE_BYTES = 4 * 2**20  # a config.json is kilobytes, a plan file (every parameter's spec) about 10 kB
MAX_JSON_DEPTH = 64  # Hugging Face configs nest 3 deep, plan files 6; Python's json recurses once per level


def read_user_file(path: Path, what: str) -> str:
    """The text of a JSON file the user named, or `InvalidConfigError` in one line.

    Refused before parsing: a file over `MAX_FILE_BYTES`, or brackets nested deeper than
    `MAX_JSON_DEPTH` (which would exhaust the parser's recursion).

    >>> read_user_file(Path("/nonexistent.json"), "model file")
    Traceback (most recent call last):
    costmodel.errors.InvalidConfigError: cannot read model file '/nonexistent.json': it does not exist; fix: check the path
    """
    if not path.exists():
        raise InvalidConfigError(f"cannot read {what} {str(path)!r}: it does not exist", fix="check the path")
    if not path.is_file():  # a directory, or a pipe that reading could block on
        kind = "a directory" if path.is_dir() else "not a regular file"
        raise InvalidConfigError(f"cannot read {what} {str(path)!r}: it is {kind}", fix="give the path of a JSON file")
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
        text = data.decode()
    except (OSError, UnicodeDecodeError) as err:
        raise InvalidConfigError(f"cannot read {what} {str(path)!r}: {err}", fix="check the file and its permissions") from err
    if len(data) > MAX_FILE_BYTES:
        raise InvalidConfigError(f"{what} {str(path)!r} is larger than {MAX_FILE_BYTES // 2**20} MiB",
                                 fix=f"give the {what} itself (a few kilobytes of JSON)")
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise InvalidConfigError(f"{what} {str(path)!r} nests brackets {depth} deep, more than {MAX_JSON_DEPTH}",
                                 fix=f"give the {what} itself; no valid one nests that deep")
    return text


def json_depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` in JSON text, brackets inside strings not counted; linear time.

    >>> json_depth('{"a": [1, {"b": "[[["}]}')
    3
    """
    depth = max_depth = 0
    for bracket in _STRING_OR_BRACKET.findall(text):
        if bracket:
            depth += 1 if bracket in "[{" else -1
            max_depth = max(max_depth, depth)
    return max_depth


# One left-to-right pass: a string (its closing quote optional, so an unterminated one ends the
# scan instead of being retried from every later quote) or a bracket, captured.
_STRING_OR_BRACKET = re.compile(r'"(?:[^"\\]|\\.)*"?|([\[\]{}])')
