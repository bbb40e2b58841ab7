"""Tests `costmodel/step/roofline.py`: compute- and memory-bound kernel times."""

import pytest
from pydantic import ValidationError

from costmodel.hardware.registry import load_hardware
from costmodel.step.kernels import Kernel, KernelKind
from costmodel.step.roofline import Efficiency, kernel_bounds_s, kernel_time_s

EFF = Efficiency(matmul_curve=((1e9, 0.5), (1e12, 0.8)), flash_attention=0.6, hbm=0.9, kernel_floor_s=0.0)


def test_big_gemm_is_compute_bound_at_curve_efficiency():
    k = Kernel(name="g", kind=KernelKind.MATMUL, flops=1e13, bytes=1e8)
    assert kernel_time_s(k, peak_flops_per_s=1e15, hbm_bytes_per_s=1e12, efficiency=EFF) == pytest.approx(1e13 / (0.8e15))


def test_thin_gemm_is_memory_bound():
    k = Kernel(name="g", kind=KernelKind.MATMUL, flops=1e9, bytes=1e9)
    assert kernel_time_s(k, peak_flops_per_s=1e15, hbm_bytes_per_s=1e12, efficiency=EFF) == pytest.approx(1e9 / 0.9e12)


def test_curve_interpolates_in_log_flops_and_is_flat_outside():
    assert EFF.matmul(1e6) == 0.5 and EFF.matmul(1e15) == 0.8
    assert EFF.matmul(10 ** 10.5) == pytest.approx(0.65)


def test_floor_is_added_to_every_kernel():
    eff = EFF.model_copy(update={"kernel_floor_s": 1e-5})
    k = Kernel(name="m", kind=KernelKind.MEMORY, flops=0, bytes=0)
    assert kernel_time_s(k, peak_flops_per_s=1e15, hbm_bytes_per_s=1e12, efficiency=eff) == 1e-5


def test_curve_must_ascend():
    with pytest.raises(ValidationError, match="ascending"):
        Efficiency(matmul_curve=((1e12, 0.8), (1e9, 0.5)))


def test_fused_attention_follows_its_kernel_curve_in_sequence_length_where_the_part_gives_one():
    """The calibrated constant holds at 4,096 keys; shorter rows amortise a block's fixed work worse, longer ones better."""
    eff = Efficiency(flash_attention=0.35, attention_overhead_tokens=250)

    def seconds(keys, efficiency=eff):
        k = Kernel(name="fa", kind=KernelKind.FLASH_ATTENTION, flops=1e12, bytes=0, attention_keys=keys, fused=True)
        return kernel_time_s(k, peak_flops_per_s=1e15, hbm_bytes_per_s=1e12, efficiency=efficiency)

    assert seconds(4096) == pytest.approx(1e12 / (1e15 * 0.35)) == pytest.approx(seconds(None))
    assert seconds(1024) > seconds(4096) > seconds(65536)
    assert seconds(1024, Efficiency(flash_attention=0.35)) == pytest.approx(seconds(4096))  # no curve: flat


def test_gpu_parts_carry_the_attention_curve_fitted_to_kernel_benchmarks_and_tpus_none():
    assert load_hardware("h100-sxm").device.efficiency.attention_overhead_tokens == 248
    assert load_hardware("a100-80gb").device.efficiency.attention_overhead_tokens == 179
    assert load_hardware("tpu-v5p").device.efficiency.attention_overhead_tokens is None


def test_a_kernel_streaming_below_its_kinds_rate_takes_longer_by_that_factor():
    gemv = Kernel(name="w", kind=KernelKind.MATMUL, flops=2e6, bytes=1e9, linear=True)
    args = {"peak_flops_per_s": 1e15, "hbm_bytes_per_s": 2e12, "efficiency": Efficiency(gemm_hbm=0.8)}
    full, half = (kernel_bounds_s(k, **args)[1] for k in (gemv, gemv.model_copy(update={"stream_efficiency": 0.5})))
    assert full == pytest.approx(1e9 / (2e12 * 0.8)) and half == pytest.approx(2 * full)


def test_gemms_and_fused_attention_stream_at_the_copy_rate_and_row_kernels_at_their_own():
    """Decode attention reads its keys and values in long contiguous runs as a GEMV reads its weights; norms and softmax
    passes keep the (lower) row-kernel rate (the A100's training fit: 0.55 against a copy's 0.85)."""
    eff = load_hardware("a100-80gb").device.efficiency
    assert eff.hbm_for(KernelKind.FLASH_ATTENTION) == eff.hbm_for(KernelKind.MATMUL) == 0.85
    assert eff.hbm_for(KernelKind.MEMORY) == 0.55
