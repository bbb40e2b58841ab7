"""Tests `validate/compile_check.py` and `validate/report.py`: a plan compiles on emulated devices."""

import pytest

from costmodel.errors import InvalidPlanError
from costmodel.model_config import ModelConfig
from planner.api import plan
from validate.compile_check import compile_in_subprocess
from validate.report import checks, predicted_argument_bytes

TINY = ModelConfig(name="tiny", hidden_size=128, num_layers=4, num_heads=8, num_kv_heads=4, ffn_size=256, vocab_size=512)


@pytest.fixture(scope="module")
def tp_plan():
    return plan(TINY, mesh="data=2,tensor=4", hardware="a100-80gb", seq_len=64, global_batch=16)


def test_plan_compiles_and_its_arguments_match_the_prediction(tp_plan):
    report = compile_in_subprocess(tp_plan)
    assert report.n_devices == 8 and report.compile_time_s > 0
    (arguments,) = checks(tp_plan, report)
    assert arguments.item == "memory arguments" and arguments.ok, (arguments.predicted, arguments.actual)
    assert report.collectives  # tensor parallelism needs collectives


def test_zero_one_shards_the_moments_over_data(tp_plan):
    zero1 = tp_plan.model_copy(update={"layout": tp_plan.layout.model_copy(update={"zero_stage": 1})})
    zero0 = tp_plan.model_copy(update={"layout": tp_plan.layout.model_copy(update={"zero_stage": 0})})
    assert predicted_argument_bytes(zero1) < predicted_argument_bytes(zero0)
    assert compile_in_subprocess(zero1).argument_bytes < compile_in_subprocess(zero0).argument_bytes


def test_a_hand_broken_spec_names_the_failure(tp_plan):
    specs = dict(tp_plan.param_specs)
    specs["layers/attn/wq"] = ("nope", None, None, None)
    with pytest.raises(InvalidPlanError, match="compiling the plan failed"):
        compile_in_subprocess(tp_plan.model_copy(update={"param_specs": specs}))
