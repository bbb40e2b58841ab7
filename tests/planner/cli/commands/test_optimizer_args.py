"""Tests `planner/cli/commands/optimizer_args.py`: the fine-tuning optimizer flags of ``plan`` and ``plan simulate``."""

import argparse

import pytest

from costmodel.inputs.train_config import OptimizerState
from planner.cli.commands.optimizer_args import add_optimizer_arguments, optimizer_from_args


def _parse(*flags):
    parser = argparse.ArgumentParser()
    add_optimizer_arguments(parser)
    return optimizer_from_args(parser.parse_args(list(flags)))


def test_the_default_is_the_fp32_state_stepped_after_the_backward():
    assert _parse() == {"optimizer_state": OptimizerState.FP32, "optimizer_in_backward": False}


@pytest.mark.parametrize("state", ["fp32", "bf16", "8bit"])
def test_each_state_parses_to_its_enum(state):
    assert _parse("--optimizer-state", state, "--optimizer-in-backward") == {"optimizer_state": OptimizerState(state),
                                                                             "optimizer_in_backward": True}


def test_an_unknown_state_is_refused_by_argparse():
    with pytest.raises(SystemExit):
        _parse("--optimizer-state", "4bit")
