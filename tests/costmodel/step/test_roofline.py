"""Tests `costmodel/step/roofline.py`: compute- and memory-bound kernel times."""

import pytest
from pydantic import ValidationError

from costmodel.step.kernels import Kernel, KernelKind
from costmodel.step.roofline import Efficiency, kernel_time_s

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
