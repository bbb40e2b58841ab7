"""``--stack NAME`` and one flag per software fact, shared by ``plan`` and ``plan simulate``.

A preset from `costmodel.inputs.stack.STACKS` sets every fact; each fact's own flag overrides it
(``--stack megatron-core --tp-overlap none``). The flags are made from `SoftwareStack`'s fields:
``--`` and the fact's name with dashes, its values from the field's type (yes/no for a bool, the
values of an enum or Literal, a number for a bounded number, ``none`` where None is allowed),
its help from the field's description. A new fact gets its flag by being declared.

>>> FACT_FLAGS["tp_overlap"].option, FACT_FLAGS["tp_overlap"].choices
('--tp-overlap', ['none', 'backward', 'gemm', 'collective-matmul'])
>>> FACT_FLAGS["moe_capacity_factor"].metavar, FACT_FLAGS["moe_capacity_factor"].value("none") is None
('F|none', True)
"""

from __future__ import annotations

import argparse
import types
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Literal

from annotated_types import Ge, Gt
from pydantic.fields import FieldInfo

from costmodel.inputs.stack import FACTS, STACKS, SoftwareStack, stack_with
from planner.cli.commands.arg_types import non_negative_int, positive_float, positive_int

# A number fact's type and bound → the parser that refuses anything else while parsing, and its metavar.
_NUMBER_PARSERS: dict[tuple[type, object], tuple[Callable[[str], int | float], str]] = {
    (float, Gt(0)): (positive_float, "F"),
    (int, Gt(0)): (positive_int, "N"),
    (int, Ge(1)): (positive_int, "N"),
    (int, Ge(0)): (non_negative_int, "N"),
}


@dataclass(frozen=True)
class FactFlag:
    """How one `SoftwareStack` fact is spelled, parsed and explained on the command line."""

    fact: str
    option: str
    words: dict[str, Any]  # each word the flag takes → the fact's value (yes → True, none → None)
    parse: Callable[[str], Any] | None  # a number fact's parser (it also passes 'none' through where None is allowed)
    metavar: str | None
    help: str

    @property
    def choices(self) -> list[str] | None:
        """The words the flag takes; None for a number fact, whose ``parse`` checks it."""
        return None if self.parse else list(self.words)

    def value(self, given: Any) -> Any:
        """The fact's value for what argparse stored: the value of a word, or a parsed number as it is."""
        return self.words.get(given, given)


def fact_flag(fact: str, field: FieldInfo) -> FactFlag:
    """The flag of the `SoftwareStack` field ``fact``; a type no flag can spell is refused, naming the field.

    >>> flag = fact_flag("dp_overlap", SoftwareStack.model_fields["dp_overlap"])
    >>> flag.option, flag.choices, flag.value("no")
    ('--dp-overlap', ['yes', 'no'], False)
    """
    option = "--" + fact.replace("_", "-")
    kind, nullable = _without_none(field.annotation)
    words = _words(kind)
    parse, metavar = None, None
    if words is None:
        number = _NUMBER_PARSERS.get((kind, *field.metadata)) if len(field.metadata) == 1 else None
        if number is None:
            raise TypeError(f"SoftwareStack.{fact}: no flag spells {field.annotation} with {field.metadata}; give it a "
                            "bool, StrEnum or Literal type, or a number > 0 (int or float) or >= 0 (int)")
        parse, metavar = number
        words = {}
        if nullable:
            parse, metavar = _or_none(parse), f"{metavar}|none"
    if nullable:
        words["none"] = None
    description = (field.description or "").replace("%", "%%")  # argparse %-formats help
    # The description speaks of the field's values (False: ..., None: ...); say which word is which.
    spelled = "".join(f"{word} = {v}, " for word, v in words.items() if str(v) != word)
    return FactFlag(fact=fact, option=option, words=words, parse=parse, metavar=metavar,
                    help=f"{description} ({spelled}default: the stack's)")


def _without_none(annotation: Any) -> tuple[Any, bool]:
    """The annotation with None taken out of a union, and whether None was in it."""
    if typing.get_origin(annotation) in (types.UnionType, typing.Union):
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return rest[0], len(rest) < len(typing.get_args(annotation))
    return annotation, False


def _words(kind: Any) -> dict[str, Any] | None:
    """Each word that chooses a fact of this type, with the value it stands for; None for a number."""
    if kind is bool:
        return {"yes": True, "no": False}
    if isinstance(kind, type) and issubclass(kind, Enum):
        return {member.value: member for member in kind}
    if typing.get_origin(kind) is Literal:
        return {str(v): v for v in typing.get_args(kind)}
    return None


def _or_none(parse: Callable[[str], int | float]) -> Callable[[str], int | float | str]:
    def parse_or_none(text: str) -> int | float | str:
        if text == "none":
            return text
        try:
            return parse(text)
        except argparse.ArgumentTypeError as err:
            raise argparse.ArgumentTypeError(f"{err}, or none") from None

    return parse_or_none


FACT_FLAGS: dict[str, FactFlag] = {fact: fact_flag(fact, SoftwareStack.model_fields[fact]) for fact in FACTS}


def stack_help() -> str:
    """One line per preset for ``--help``: its name and the facts it sets apart from the JAX program's.

    >>> "megatron-core: tp_overlap=gemm" in stack_help()
    True
    """
    jax = STACKS["jax"]
    lines = []
    for name, stack in STACKS.items():
        diff = [f"{k}={_show(getattr(stack, k))}" for k in FACTS if getattr(stack, k) != getattr(jax, k)]
        lines.append(f"{name}: {', '.join(diff) or 'the JAX program plan validate lowers'}")
    return "; ".join(lines)


def _show(value: object) -> str:
    return ("yes" if value else "no") if isinstance(value, bool) else "none" if value is None else str(value)


def add_stack_arguments(parser: argparse.ArgumentParser) -> None:
    """``--stack`` and every fact's flag; each flag's value stays None unless given.

    >>> parser = argparse.ArgumentParser()
    >>> add_stack_arguments(parser)
    >>> parser.parse_args(["--fused-norm", "no"]).fused_norm, parser.parse_args([]).fused_norm
    ('no', None)
    """
    parser.add_argument("--stack", choices=list(STACKS), default="jax",
                        help=f"software stack that runs the layout (default jax); presets: {stack_help()}")
    for flag in FACT_FLAGS.values():
        parser.add_argument(flag.option, dest=flag.fact, choices=flag.choices, type=flag.parse, metavar=flag.metavar,
                            help=flag.help)


def stack_from_args(args: argparse.Namespace) -> SoftwareStack:
    """The ``--stack`` preset with every fact flag given applied over it.

    >>> parser = argparse.ArgumentParser()
    >>> add_stack_arguments(parser)
    >>> stack = stack_from_args(parser.parse_args(["--stack", "megatron-core", "--tp-overlap", "none"]))
    >>> stack.name, stack.tp_overlap
    ('custom', <TpOverlap.NONE: 'none'>)
    """
    given = {fact: getattr(args, fact) for fact in FACT_FLAGS}
    return stack_with(args.stack, **{fact: FACT_FLAGS[fact].value(v) for fact, v in given.items() if v is not None})
