"""Tests `planner/exports.py`: MaxText overrides, logical rules, Markdown."""

import math

import pytest

from planner.api import plan
from planner.exports import flax_logical_rules, markdown_report, to_maxtext


@pytest.fixture(scope="module")
def tp_plan():
    return plan("llama3-8b", mesh="data=4,tensor=8", hardware="h100-sxm", global_batch=64)


def test_maxtext_parallelism_multiplies_to_the_device_count(tp_plan):
    mt = to_maxtext(tp_plan)
    degrees = [v for k, v in mt.items() if k.endswith("_parallelism")]
    assert math.prod(degrees) == tp_plan.layout.n_devices
    assert mt["ici_tensor_parallelism"] == 8 and mt["dcn_data_parallelism"] * mt["dcn_fsdp_parallelism"] == 4
    assert mt["per_device_batch_size"] == 64 / 32


def test_logical_rules_put_heads_and_mlp_on_the_tensor_axis(tp_plan):
    rules = dict(flax_logical_rules(tp_plan))
    assert rules["heads"] == ("tensor",) and rules["mlp"] == ("tensor",) and rules["head_dim"] is None


def test_markdown_names_the_layout_and_the_alternatives(tp_plan):
    text = markdown_report(tp_plan)
    assert text.startswith("# Plan: llama3-8b on 32× h100-sxm") and "| tensor | 8 | tp | nvlink4 |" in text
    assert text.count("\n| dp") == len(tp_plan.alternatives)
