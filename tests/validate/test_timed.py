"""Tests `validate/timed.py`: a plan runs and is timed on 1 and on 4 emulated devices; its prediction is finite."""

import math

import pytest

from costmodel.layout import Layout
from costmodel.model_config import ModelConfig
from planner.api import layout_plan
from validate.cpu_profile import CpuMeasurement
from validate.timed import predicted_cpu_step_s, time_in_subprocess

TINY = ModelConfig(name="tiny", hidden_size=64, num_layers=2, num_heads=4, ffn_size=128, vocab_size=256)
MEASURED = CpuMeasurement(matmul_flops_per_s=((1e6, 2e9), (1e9, 4e10)), memory_bytes_per_s=8e9, kernel_floor_s=2e-5)


@pytest.mark.parametrize("layout", [Layout(micro_batch=2), Layout(dp=2, tp=2, micro_batch=1)], ids=["1-device", "dp2-tp2"])
def test_a_plan_is_timed_with_repeats(layout):
    plan = layout_plan(TINY, layout, hardware="cpu", seq_len=16, global_batch=4)
    run = time_in_subprocess(plan, steps=2, repeats=3)
    assert run.n_devices == layout.n_devices and len(run.block_step_s) == 3
    assert run.median_step_s > 0 and run.spread >= 0
    predicted = predicted_cpu_step_s(plan, MEASURED)
    assert math.isfinite(predicted) and predicted > 0
