"""``--dp --tp --pp --cp --interleave --micro-batch --recompute --sequence-parallel --zero``: the layout parts ``plan`` keeps.

One flag per field of `search.pins.LayoutPins`, spelled by `search.pins.flag_of`, its help from the
field's description; a flag not given leaves that part to the planner.

>>> parser = argparse.ArgumentParser()
>>> add_pin_arguments(parser)
>>> pins_from_args(parser.parse_args(["--zero", "3", "--micro-batch", "2", "--sequence-parallel", "no"])).flags
'--micro-batch 2 --sequence-parallel no --zero 3'
>>> pins_from_args(parser.parse_args([])).given
{}
"""

from __future__ import annotations

import argparse
from typing import Any

from costmodel.inputs.layout import Recompute
from planner.cli.commands.arg_types import non_negative_int, positive_int
from search.pins import LayoutPins, flag_of

_YES_NO = {"yes": True, "no": False}


def _spelling(name: str) -> dict[str, Any]:
    """argparse keywords of pin ``name``: its choices or its number parser."""
    if name == "sequence_parallel":
        return {"choices": list(_YES_NO)}
    if name == "recompute":
        return {"choices": [r.value for r in Recompute]}
    if name == "zero_stage":
        return {"type": non_negative_int, "choices": [0, 1, 2, 3]}
    return {"type": positive_int, "metavar": "N"}


def add_pin_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per `LayoutPins` field, in a group of its own in ``--help``; each stays None unless given."""
    group = parser.add_argument_group("layout pins", "fix these parts of the layout; the planner chooses the rest (the plan's "
                                      "summary and solver.pins name them)")
    for name, field in LayoutPins.model_fields.items():
        group.add_argument(flag_of(name), dest=f"pin_{name}", help=(field.description or "").replace("%", "%%"), **_spelling(name))


def pins_from_args(args: argparse.Namespace) -> LayoutPins:
    """The pins the flags give."""
    given = {name: getattr(args, f"pin_{name}") for name in LayoutPins.model_fields}
    return LayoutPins(**{name: _YES_NO.get(value, value) if name == "sequence_parallel" else value
                         for name, value in given.items() if value is not None})
