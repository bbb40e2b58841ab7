"""Tests `benchmarks/export_check.py`'s Megatron argument lists, built without Megatron-LM or its venv."""

from pathlib import Path

import pytest

from benchmarks.export_check import MEGATRON_LAUNCH_ARGS, megatron_cases, megatron_parser
from planner.api import plan
from planner.cli.exports import to_megatron


@pytest.fixture(scope="module")
def small_plan():
    return plan("gpt2", mesh="data=2,tensor=2", hardware="h100-sxm", global_batch=16, stack="megatron-core")


def test_the_export_is_passed_as_is_with_the_launch_scripts_arguments(small_plan):
    assert megatron_cases(small_plan)["as exported"] == [*to_megatron(small_plan), *MEGATRON_LAUNCH_ARGS]


def test_each_control_differs_from_the_export_in_one_place_megatron_must_refuse(small_plan):
    cases = megatron_cases(small_plan)
    exported = cases["as exported"]
    for name in ("misspelled flag", "batch not a multiple of micro-batch x dp"):
        changed = [(a, b) for a, b in zip(exported, cases[name], strict=True) if a != b]
        assert len(changed) == 1, name
    assert "--tensor-model-paralel-size" in cases["misspelled flag"]
    lay = small_plan.layout
    bad = int(cases["batch not a multiple of micro-batch x dp"][exported.index("--global-batch-size") + 1])
    assert bad % (lay.micro_batch * lay.dp) != 0


def test_without_megatron_lm_the_row_says_it_was_not_run(small_plan):
    assert megatron_parser(None, None, small_plan).startswith("not run")
    assert megatron_parser(Path("/nonexistent/bin/python"), Path("."), small_plan).startswith("not run")
