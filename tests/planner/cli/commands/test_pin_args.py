"""Tests `planner/cli/commands/pin_args.py`: one flag per layout pin, unset ones left to the planner."""

import argparse

import pytest

from costmodel.inputs.layout import Recompute
from planner.cli.commands.pin_args import add_pin_arguments, pins_from_args
from planner.cli.commands.plan_cmd import add_arguments
from search.pins import LayoutPins, flag_of


def _parse(*argv):
    parser = argparse.ArgumentParser()
    add_pin_arguments(parser)
    return pins_from_args(parser.parse_args(list(argv)))


def test_every_pin_has_a_flag_with_its_fields_description():
    parser = argparse.ArgumentParser()
    add_pin_arguments(parser)
    helps = {a.option_strings[0]: a.help for a in parser._actions if a.option_strings != ["-h", "--help"]}
    assert helps == {flag_of(name): field.description for name, field in LayoutPins.model_fields.items()}


def test_flags_become_typed_pins_and_unset_ones_stay_free():
    pins = _parse("--dp", "2", "--tp", "4", "--pp", "2", "--cp", "1", "--interleave", "2", "--micro-batch", "1",
                  "--recompute", "selective", "--sequence-parallel", "yes", "--zero", "0")
    assert pins == LayoutPins(dp=2, tp=4, pp=2, cp=1, interleave=2, micro_batch=1, recompute=Recompute.SELECTIVE,
                              sequence_parallel=True, zero_stage=0)
    assert _parse("--sequence-parallel", "no").given == {"sequence_parallel": False} and _parse().given == {}


@pytest.mark.parametrize("argv", [["--zero", "4"], ["--tp", "0"], ["--recompute", "some"], ["--sequence-parallel", "maybe"]])
def test_a_bad_value_is_refused_while_parsing(argv):
    with pytest.raises(SystemExit):
        _parse(*argv)


def test_plan_takes_the_pins_beside_the_software_fact_flags_they_prefix():
    # --tp and --dp are prefixes of --tp-overlap and --dp-overlap: each flag keeps its own meaning.
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--model", "gpt2", "--mesh", "8", "--tp", "2", "--tp-overlap", "none", "--dp", "4"])
    assert (args.pin_tp, args.tp_overlap, args.pin_dp, args.dp_overlap) == (2, "none", 4, None)
