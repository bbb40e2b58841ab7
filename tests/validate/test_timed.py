"""Tests `validate/timed.py`: a plan is timed with repeats on 1 device and on 4 emulated devices;
its prediction on a profile for its device count is finite."""

import math

import pytest

from costmodel.errors import InvalidPlanError
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from planner.api import layout_plan
from validate.cpu_profile import CpuMeasurement, cpu_cluster
from validate.timed import TimedRun, cpu_estimate, predicted_step_s, time_in_subprocess, time_plan

TINY = ModelConfig(name="tiny", hidden_size=64, num_layers=2, num_heads=4, ffn_size=128, vocab_size=256)


def _cluster(n_devices: int):
    return cpu_cluster(CpuMeasurement(n_devices=n_devices, matmul_flops_per_s=((1e6, 2e9), (1e9, 4e10)), memory_kernel_bytes_per_s=8e9,
                                      first_touch_s_per_byte=1e-9, transpose_s_per_byte=1e-10,
                                      fused_transpose_s_per_byte=1e-9, kernel_floor_s=1e-6, link_bytes_per_s=1e9, link_latency_s=1e-5,
                                      load_average=0.0, other_cpu_share=None, host="test", jax_version="0"))


def _check(run: TimedRun, n_devices: int, repeats: int) -> None:
    assert run.n_devices == n_devices and len(run.repeat_step_s) == repeats
    assert run.median_step_s > 0 and run.spread >= 0 and all(load >= 0 for load in run.load_average)
    assert run.other_cpu_share is None or 0 <= run.other_cpu_share <= 1


def test_one_device_is_timed_in_this_process_and_predicted():
    plan = layout_plan(TINY, Layout(micro_batch=2), hardware="cpu", seq_len=16, global_batch=4)
    _check(time_plan(plan, steps=2, repeats=3, warmup=1), 1, 3)
    estimate = cpu_estimate(plan, _cluster(1))
    assert math.isfinite(estimate.step_time_s) and estimate.step_time_s == predicted_step_s(plan, _cluster(1)) > 0


def test_four_emulated_devices_are_timed_in_a_subprocess():
    plan = layout_plan(TINY, Layout(dp=2, tp=2, micro_batch=1), hardware="cpu", seq_len=16, global_batch=4)
    _check(time_in_subprocess(plan, steps=2, repeats=2, warmup=1), 4, 2)
    assert math.isfinite(predicted_step_s(plan, _cluster(4)))


def test_a_profile_for_another_device_count_is_refused():
    plan = layout_plan(TINY, Layout(dp=2, micro_batch=1), hardware="cpu", seq_len=16, global_batch=4)
    with pytest.raises(InvalidPlanError, match="measured with 8 devices"):
        predicted_step_s(plan, _cluster(8))
