"""Tests `planner/cli/commands/stack_args.py`: ``--stack`` and the flag of each software fact."""

import argparse

import pytest

from planner.cli.commands.stack_args import add_stack_arguments, stack_from_args


def _parse(*argv):
    parser = argparse.ArgumentParser()
    add_stack_arguments(parser)
    return stack_from_args(parser.parse_args(list(argv)))


def test_a_fact_flag_overrides_the_preset_and_renames_the_stack():
    assert _parse().name == "jax" and _parse().fp32_weights
    custom = _parse("--stack", "jax", "--fp32-weights", "no")
    assert custom.name == "custom" and not custom.fp32_weights


@pytest.mark.parametrize(("flag", "expected"), [("1.0", 1.0), ("none", None)])
def test_moe_capacity_factor_takes_a_number_or_none_for_dropless(flag, expected):
    assert _parse("--moe-capacity-factor", flag).moe_capacity_factor == expected
    assert _parse("--stack", "megatron-core", "--moe-capacity-factor", flag).moe_capacity_factor == expected


@pytest.mark.parametrize("flag", ["lots", "0", "-1"])
def test_a_bad_capacity_factor_is_refused_with_an_example(flag, capsys):
    with pytest.raises(SystemExit):
        _parse("--moe-capacity-factor", flag)
    assert "--moe-capacity-factor 1.25" in capsys.readouterr().err
