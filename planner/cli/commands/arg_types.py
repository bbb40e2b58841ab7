"""argparse ``type=`` helpers for numeric flags: a bad number is refused while parsing, with the
error catalog's one line (``plan: error: argument --seq-len: ...; fix: ...``, exit 2).

>>> positive_int("2048"), positive_float("15e12"), non_negative_int("0")
(2048, 15000000000000.0, 0)
>>> positive_int("0")
Traceback (most recent call last):
argparse.ArgumentTypeError: '0' is not a positive whole number; fix: give a whole number of at least 1, e.g. 8
"""

from __future__ import annotations

import argparse
import math

AUTO = "auto"  # a knob left to the planner


def positive_int(text: str) -> int:
    """A whole number ≥ 1 (a count, a size, a degree)."""
    return _whole(text, minimum=1, what="positive whole number", example="8")


def positive_int_or_auto(text: str) -> int | str:
    """A whole number ≥ 1, or ``auto``: left to the planner (``plan simulate --micro-batch auto``).

    >>> positive_int_or_auto("auto"), positive_int_or_auto("4")
    ('auto', 4)
    """
    return AUTO if text == AUTO else _whole(text, minimum=1, what="positive whole number or auto", example="8, or auto")


def positive_int_or_none(text: str) -> int | None:
    """A whole number ≥ 1, or ``none`` (no limit: ``plan serve --prefill-chunk none``).

    >>> positive_int_or_none("none"), positive_int_or_none("512")
    (None, 512)
    """
    return None if text == "none" else _whole(text, minimum=1, what="positive whole number or none", example="2048, or none")


def probability(text: str) -> float:
    """A number from 0 to 1 (an acceptance rate).

    >>> probability("0.7"), probability("0")
    (0.7, 0.0)
    """
    value = _float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a probability; fix: give a number from 0 to 1, e.g. 0.7")
    return value


def non_negative_int(text: str) -> int:
    """A whole number ≥ 0 (a seed, a stage index)."""
    return _whole(text, minimum=0, what="non-negative whole number", example="0")


def positive_float(text: str) -> float:
    """A finite number > 0 (seconds, tokens, a tolerance); scientific notation such as 15e12 is accepted."""
    value = _float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite positive number; fix: give a number above 0, e.g. 0.5 or 15e12")
    return value


def non_negative_float(text: str) -> float:
    """A finite number ≥ 0 (a reserve that may be none)."""
    value = _float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite non-negative number; fix: give a number of at least 0, e.g. 4")
    return value


# What every numeric flag of `plan` uses.
NUMERIC_TYPES = (positive_int, positive_int_or_auto, positive_int_or_none, non_negative_int, positive_float, non_negative_float,
                 probability)


def add_memory_reserve_argument(parser: argparse.ArgumentParser) -> None:
    """``--memory-reserve-gib``, shared by ``plan``, ``plan simulate``, ``plan largest`` and ``plan budget``."""
    parser.add_argument("--memory-reserve-gib", type=non_negative_float,
                        help="GiB per device the runtime takes beside the plan's arrays (CUDA context, NCCL buffers, allocator "
                             "fragmentation); a plan fits within the part's usable memory less this (default: the part's, "
                             "about 4 GiB on an 80 GB GPU; docs/clusters.md#usable-memory)")


def _float(text: str) -> float:
    """``text`` as a float, NaN where it is none (so every range check refuses it)."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def _whole(text: str, *, minimum: int, what: str, example: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{text!r} is not a {what}; fix: give a whole number of at least {minimum}, e.g. {example}")
    return value


PRECISION_HELP = ("fp32 (everything fp32), tf32 (fp32 storage, GEMMs at the tf32 peak), bf16 (default; fp32 gradients), "
                  "fp16 (fp16 gradients, dynamic loss scaling) or fp8 (bf16 with the linear layers' GEMMs in fp8, as "
                  "Transformer Engine runs them); the part needs that dtype's peak (`plan hardware` lists them)")
