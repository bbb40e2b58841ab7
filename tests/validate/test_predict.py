"""Tests `validate/predict.py` against XLA for the fp32 and fp8 precisions of the reference program."""

import pytest

from costmodel.layout import Layout
from costmodel.model_config import ModelConfig
from planner.api import layout_plan
from validate.compile_check import compile_in_subprocess
from validate.report import checks

# Large enough that the step's activations and parameters, not fixed buffers, set the peak.
LLAMA = ModelConfig(name="mid-llama", hidden_size=1024, num_layers=4, num_heads=16, num_kv_heads=4, ffn_size=3584, vocab_size=32000)


@pytest.mark.parametrize("precision", ["fp32", "fp8"])
def test_every_check_of_a_small_plan_is_predicted_and_within_tolerance(precision):
    plan = layout_plan(LLAMA, Layout(dp=2, tp=4, micro_batch=2), hardware="h100-sxm", seq_len=1024, global_batch=8,
                       precision=precision)
    assert plan.train.precision.value == precision
    results = {(c.item, c.axis): c for c in checks(plan, compile_in_subprocess(plan))}
    assert {("memory arguments", None), ("memory per device", None), ("flops", None), ("all-reduce bytes", "data"),
            ("all-reduce bytes", "tensor")} <= set(results)
    assert all(c.ok for c in results.values()), {k: (c.predicted, c.actual) for k, c in results.items() if not c.ok}
