"""Roofline time of one kernel on one device.

time = max(FLOPs / (peak · efficiency), bytes / (HBM bandwidth · HBM efficiency)) + launch floor

The efficiencies are the device's (`costmodel.hardware.profile.DeviceSpec`): what its GEMMs,
fused attention kernels and streaming kernels reach in micro-benchmarks. GEMM efficiency
falls for small problems (tile and wave quantisation, launch latency); the device gives
it as a curve over a kernel's FLOPs. A fused attention kernel's efficiency rises with the keys a
query row meets (each thread block's fixed work is amortised over them): where the part gives
its fitted fixed work, the calibrated constant follows that curve (`Efficiency.flash_attention_at`).

>>> from costmodel.step.kernels import Kernel, KernelKind
>>> k = Kernel(name="g", kind=KernelKind.MEMORY, flops=0, bytes=2e9)
>>> round(kernel_time_s(k, peak_flops_per_s=1e15, hbm_bytes_per_s=2e12, efficiency=Efficiency()), 4)
0.0012
"""

from __future__ import annotations

import bisect
import math

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, field_validator

from costmodel.errors import UnsupportedError
from costmodel.step.attention_efficiency import AttentionCurve
from costmodel.step.kernels import Kernel, KernelKind

# A part's calibrated `flash_attention` is read as its fused attention's efficiency at this many keys per causal
# query row: the training runs it is fitted to are mostly 2k–8k tokens long.
ATTENTION_REFERENCE_KEYS = 4096.0
# Below this no kernel was ever measured; smaller values only make products of a profile's
# numbers underflow to zero (a fuzzed profile with 1e-300 efficiencies and peaks did).
MIN_EFFICIENCY = 1e-3


class Efficiency(BaseModel):
    """Achievable fractions of a device's peaks, measured by micro-benchmarks."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # a profile is finite numbers

    matmul_curve: tuple[tuple[float, float], ...] = Field(
        ((1e9, 0.45), (1e10, 0.7), (1e11, 0.8), (1e12, 0.85)),
        description="(GEMM FLOPs, fraction of peak reached) points, ascending; interpolated in log FLOPs.",
    )
    flash_attention: float = Field(0.6, ge=MIN_EFFICIENCY, le=1, description="Fraction of peak a fused attention kernel reaches "
                                   "(at 4,096 keys a query row where `attention_overhead_tokens` is set).")
    attention_overhead_tokens: float | None = Field(
        None, ge=0, description="A fused attention kernel's fixed work per thread block, in key tokens, fitted to published "
        "kernel benchmarks (`costmodel.step.attention_efficiency`): its efficiency then follows the kernel's curve in sequence "
        "length (`flash_attention_at`); None: the same at every length.")
    hbm: float = Field(0.85, ge=MIN_EFFICIENCY, le=1,
                       description="Fraction of HBM bandwidth a memory-bound elementwise or row kernel (norms, softmax) reaches.")
    gemm_hbm: float | None = Field(
        None, ge=MIN_EFFICIENCY, le=1,
        description="Fraction of HBM bandwidth a memory-bound GEMM or fused attention reaches: a GEMV streams its weights "
        "once, and decode attention its keys and values, in long contiguous reads as a plain copy does; None: as `hbm`.",
    )
    kernel_floor_s: NonNegativeFloat = Field(5e-6, description="Launch and tail latency added to every kernel.")
    overlap_slowdown: float = Field(
        0.0, ge=0, lt=1,
        description="Fraction of compute speed lost while a collective runs beside it (the SMs and HBM bandwidth NCCL's "
        "kernels take); 0 where copy engines move the data.",
    )

    @field_validator("matmul_curve")
    @classmethod
    def _ascending(cls, curve: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
        if not curve or any(a[0] >= b[0] for a, b in zip(curve, curve[1:])):
            raise ValueError("matmul_curve needs at least one point, in ascending FLOPs")
        if any(not 0 < flops < math.inf for flops, _ in curve):  # interpolated in log FLOPs
            raise ValueError("matmul_curve FLOPs must be positive")
        if any(not MIN_EFFICIENCY <= eff <= 1 for _, eff in curve):
            raise ValueError(f"matmul_curve efficiencies must be in [{MIN_EFFICIENCY:g}, 1]")
        return curve

    def calibrated(self, *, matmul_scale: float, flash_attention: float, hbm: float, matmul_knee: float = 1.0,
                   overlap_slowdown: float | None = None) -> Efficiency:
        """These efficiencies with the GEMM curve scaled (and shifted along FLOPs by
        ``matmul_knee``) and the attention/HBM (and, if given, overlap) ones replaced.

        >>> Efficiency(matmul_curve=((1e9, 0.5),)).calibrated(matmul_scale=0.8, flash_attention=0.4, hbm=0.9).matmul(1e9)
        0.4
        """
        curve = tuple((f * matmul_knee, min(1.0, e * matmul_scale)) for f, e in self.matmul_curve)
        update = {"matmul_curve": curve, "flash_attention": flash_attention, "hbm": hbm}
        if overlap_slowdown is not None:
            update["overlap_slowdown"] = overlap_slowdown
        return self.model_copy(update=update)

    def flash_attention_at(self, keys: float | None) -> float:
        """The fused attention efficiency at ``keys`` keys a causal query row (None: unknown, `flash_attention`): the
        kernel curve's ratio to its value at `ATTENTION_REFERENCE_KEYS`, times `flash_attention`, at most 1.

        >>> eff = Efficiency(flash_attention=0.4, attention_overhead_tokens=200)
        >>> round(eff.flash_attention_at(1024), 3), eff.flash_attention_at(4096), round(eff.flash_attention_at(65536), 3)
        (0.298, 0.4, 0.448)
        """
        if keys is None or self.attention_overhead_tokens is None:
            return self.flash_attention
        curve = AttentionCurve(peak_fraction=1.0, overhead_tokens=self.attention_overhead_tokens)
        ratio = curve.efficiency(keys, causal=True) / curve.efficiency(ATTENTION_REFERENCE_KEYS, causal=True)
        return min(1.0, self.flash_attention * ratio)

    def hbm_for(self, kind: KernelKind) -> float:
        """The fraction of HBM bandwidth a memory-bound kernel of ``kind`` reaches: GEMMs and fused attention stream
        (`gemm_hbm`), the rest are row and elementwise kernels (`hbm`).

        >>> Efficiency(hbm=0.6, gemm_hbm=0.85).hbm_for(KernelKind.MATMUL), Efficiency(hbm=0.6).hbm_for(KernelKind.MATMUL)
        (0.85, 0.6)
        """
        streams = kind in (KernelKind.MATMUL, KernelKind.FLASH_ATTENTION)
        return self.gemm_hbm if streams and self.gemm_hbm is not None else self.hbm

    def matmul(self, flops: float) -> float:
        """GEMM efficiency at ``flops``, log-linear between points, flat outside."""
        sizes = [p[0] for p in self.matmul_curve]
        i = bisect.bisect_left(sizes, flops)
        if i == 0:
            return self.matmul_curve[0][1]
        if i == len(sizes):
            return self.matmul_curve[-1][1]
        (x0, y0), (x1, y1) = self.matmul_curve[i - 1], self.matmul_curve[i]
        w = (math.log(flops) - math.log(x0)) / (math.log(x1) - math.log(x0))
        return y0 + w * (y1 - y0)


def kernel_bounds_s(kernel: Kernel, *, peak_flops_per_s: float, hbm_bytes_per_s: float, efficiency: Efficiency,
                    instructions_per_s: float | None = None) -> tuple[float, float]:
    """(compute, HBM) seconds of one launch of ``kernel``: its FLOPs at the peak its kind reaches (a kernel that counts
    CUDA-core instructions also bounded by ``instructions_per_s``, the part's issue rate), its bytes at HBM's.

    >>> k = Kernel(name="dequant_gemv", kind=KernelKind.MEMORY, flops=0, bytes=1e9, instructions=4e10)
    >>> kernel_bounds_s(k, peak_flops_per_s=1e15, hbm_bytes_per_s=2e12, efficiency=Efficiency(hbm=1.0), instructions_per_s=2e13)
    (0.002, 0.0005)
    """
    memory_s = kernel.bytes / (hbm_bytes_per_s * efficiency.hbm_for(kernel.kind) * kernel.stream_efficiency)
    if kernel.kind is KernelKind.MATMUL:
        compute_s = kernel.flops / (peak_flops_per_s * efficiency.matmul(kernel.flops))
    elif kernel.kind is KernelKind.FLASH_ATTENTION:
        compute_s = kernel.flops / (peak_flops_per_s * efficiency.flash_attention_at(kernel.attention_keys))
    else:
        compute_s = 0.0
    if kernel.instructions:
        if instructions_per_s is None:
            raise UnsupportedError(f"the {kernel.name} kernel is bounded by CUDA-core instructions, and this part's profile "
                                   "gives no instruction issue rate", fix="use a100-80gb, h100-sxm or h200, or --weight-kernel fused")
        compute_s = max(compute_s, kernel.instructions / instructions_per_s)
    return compute_s, memory_s


def kernel_time_s(kernel: Kernel, *, peak_flops_per_s: float, hbm_bytes_per_s: float, efficiency: Efficiency,
                  instructions_per_s: float | None = None) -> float:
    """Seconds ``kernel.count`` launches of ``kernel`` take on a device with these peaks: the longer of its bounds
    (`kernel_bounds_s`) and the launch floor.

    >>> k = Kernel(name="dequant_gemv", kind=KernelKind.MEMORY, flops=0, bytes=1e9, instructions=4e10)
    >>> round(kernel_time_s(k, peak_flops_per_s=1e15, hbm_bytes_per_s=2e12, efficiency=Efficiency(), instructions_per_s=2e13), 4)
    0.002
    """
    compute_s, memory_s = kernel_bounds_s(kernel, peak_flops_per_s=peak_flops_per_s, hbm_bytes_per_s=hbm_bytes_per_s,
                                          efficiency=efficiency, instructions_per_s=instructions_per_s)
    floor_s = 0.0 if kernel.fused else efficiency.kernel_floor_s
    return kernel.count * (max(compute_s, memory_s) + floor_s)
