"""Tests `planner/cli/commands/stack_args.py`: ``--stack`` and the flag of each software fact."""

import argparse
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from costmodel.inputs.stack import FACTS, STACKS, SoftwareStack, stack_with
from planner.cli.commands.stack_args import FACT_FLAGS, add_stack_arguments, fact_flag, stack_from_args


def _parser():
    parser = argparse.ArgumentParser()
    add_stack_arguments(parser)
    return parser


def _parse(*argv):
    return stack_from_args(_parser().parse_args(list(argv)))


def test_every_fact_has_a_flag_named_after_it_and_the_bookkeeping_none():
    options = {a.option_strings[0] for a in _parser()._actions}
    assert set(FACTS) == set(SoftwareStack.model_fields) - {"name", "citation"} == set(FACT_FLAGS)
    assert {"--" + fact.replace("_", "-") for fact in FACTS} | {"--stack", "-h"} == options


def test_each_flag_takes_its_facts_words_and_says_what_the_fact_means():
    assert FACT_FLAGS["fused_norm"].choices == ["yes", "no"]
    assert FACT_FLAGS["attention"].choices == ["flash", "materialized"]
    assert FACT_FLAGS["selective_recompute"].choices == ["selective", "selective-op", "selective-layer"]
    for fact, flag in FACT_FLAGS.items():
        assert flag.help.startswith(SoftwareStack.model_fields[fact].description), fact


@pytest.mark.parametrize("fact", FACTS)
def test_every_flag_round_trips_to_its_fact_over_a_preset(fact):
    flag, base = FACT_FLAGS[fact], STACKS["megatron-core"]
    numbers = {"F|none": ["none", "2.5"], "N": ["1", "8"]}
    for word in flag.choices or numbers[flag.metavar]:
        stack = _parse("--stack", "megatron-core", flag.option, word)
        want = stack_with(base, **{fact: flag.value(flag.parse(word) if flag.parse else word)})
        assert stack == want and stack.model_dump(exclude={"name", fact}) == base.model_dump(exclude={"name", fact})
        assert stack.name == ("megatron-core" if getattr(stack, fact) == getattr(base, fact) else "custom")


def test_a_fact_flag_overrides_the_preset_and_renames_the_stack():
    assert _parse().name == "jax" and _parse().fp32_weights
    custom = _parse("--stack", "jax", "--fp32-weights", "no")
    assert custom.name == "custom" and not custom.fp32_weights
    assert _parse("--stack", "megatron-core", "--tp-overlap", "none") == stack_with("megatron-core", tp_overlap="none")


@pytest.mark.parametrize(("flag", "expected"), [("1.0", 1.0), ("none", None)])
def test_moe_capacity_factor_takes_a_number_or_none_for_dropless(flag, expected):
    assert _parse("--moe-capacity-factor", flag).moe_capacity_factor == expected
    assert _parse("--stack", "megatron-core", "--moe-capacity-factor", flag).moe_capacity_factor == expected


@pytest.mark.parametrize("flag", ["lots", "0", "-1", "inf"])
def test_a_bad_capacity_factor_is_refused_while_parsing_naming_what_it_takes(flag, capsys):
    with pytest.raises(SystemExit):
        _parse("--moe-capacity-factor", flag)
    assert "not a finite positive number; fix: give a number above 0" in capsys.readouterr().err


def test_a_bad_word_is_refused_with_the_choices(capsys):
    with pytest.raises(SystemExit):
        _parse("--tp-overlap", "sometimes")
    assert "choose from 'none', 'backward', 'gemm'" in capsys.readouterr().err


class _Future(BaseModel):
    """Facts a later stack might declare, to show what their flags would be."""

    kernel: Literal["triton", "cuda"] = Field("cuda", description="Which 5% kernel.")
    streams: int | None = Field(None, ge=0, description="Copy streams.")
    label: str = Field("", description="Not a fact a flag can spell.")


def test_a_new_fact_gets_its_flag_from_its_type_and_description():
    kernel, streams = fact_flag("kernel", _Future.model_fields["kernel"]), fact_flag("streams", _Future.model_fields["streams"])
    assert (kernel.option, kernel.choices, kernel.help) == ("--kernel", ["triton", "cuda"], "Which 5%% kernel. (default: the stack's)")
    assert (streams.choices, streams.metavar, streams.parse("0"), streams.value(streams.parse("none"))) == (None, "N|none", 0, None)
    with pytest.raises(argparse.ArgumentTypeError, match="or none"):
        streams.parse("-1")
    with pytest.raises(TypeError, match="SoftwareStack.label: no flag spells"):
        fact_flag("label", _Future.model_fields["label"])
