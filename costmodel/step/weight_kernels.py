"""The GEMMs of int4 weight-only layers as GPTQ's kernels run them, not fused.

A fused weight-only kernel (`WeightKernel.FUSED`: Marlin, TensorRT-LLM's, gpt-fast's tinygemm) reads
each int4 weight once and dequantizes it in registers; `costmodel.step.serving_kernels.linear_kernels`
costs that. The kernels AutoGPTQ dispatches (and Hugging Face optimum through it) do more, counted
here from their code (AutoGPTQ/AutoGPTQ @9f7d370, 2025-04; the benchmarks that ran them do not
state their versions):

- ``autogptq-cuda-old`` (``auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py``): below
  ``kernel_switch_threshold`` = 128 input rows, ``vecquant4matmul_faster_old``
  (``autogptq_extension/cuda_256/autogptq_cuda_kernel_256.cu``) runs a grid with one slice per
  row (``blockIdx.z``): every row's blocks read the packed weights again and dequantize them again
  on the CUDA cores, about 39 instructions for 8 weights by the source (table lookups, shifts, the
  scale and zero, 8 HFMA2; the division by the group size counted as one), atomically adding into
  an fp32 output that is zero-filled before and cast to fp16 after (two more kernels). From 128
  rows the weights are dequantized by eager PyTorch operators into a 16-bit copy (an int32 shift,
  an int8 cast, a mask, the zero subtracted, the scale multiplied: 16.5 bytes of HBM traffic a
  weight) that ``torch.matmul`` then reads.
- ``exllama`` (``autogptq_extension/exllama``): below ``matmul_recons_thd`` = 8 rows (AutoGPTQ's
  ``auto_gptq/modeling/_utils.py`` sets it; ``exllama_ext.cpp`` dispatches on it) ``q4_matmul``
  gives each row a grid row of its own (``cuda_func/q4_matmul.cu``): again the weights read and
  dequantized per row, about 44 instructions for 8 weights (``matrix.cuh`` ``dot_product_8``).
  From 8 rows every call reconstructs the whole fp16 weight into a buffer (``q4_matrix.cu``
  ``reconstruct``: the int4 read, 2 bytes a weight written) and ``cublasHgemm`` reads it.

A kernel's CUDA-core instructions are bounded by the part's issue rate
(`costmodel.hardware.profile.DeviceSpec.instructions_per_s`), its bytes by HBM; the weights'
re-reads per row are counted from HBM (a layer's matrices are tens of MB, the size of an A100's
L2, and a row's blocks are scheduled after the previous row's). Not counted: the group scales and
zeros (4 % of the int4 bytes at group size 128) and the extra operators an eager stack dispatches
around each kernel (its host count is the stack's, `costmodel.inputs.serving_stack`).

>>> from costmodel.inputs.train_config import TrainConfig
>>> exllama = TrainConfig(workload="decode", inference={"weight_dtype": "int4", "weight_kernel": "exllama"})
>>> [(k.name, k.kind.value) for k in gptq_linear_kernels("mlp_up", rows=16, d_in=4096, d_out=4096, train=exllama)]
[('mlp_up_reconstruct', 'memory'), ('mlp_up', 'matmul')]
>>> [k.instructions for k in gptq_linear_kernels("mlp_up", rows=1, d_in=8, d_out=8, train=exllama)]
[352.0]
"""

from __future__ import annotations

from costmodel.inputs.train_config import TrainConfig
from costmodel.inputs.workload import FrozenDtype, WeightKernel
from costmodel.step.kernels import Kernel, KernelKind

INT4_BYTES = FrozenDtype.INT4.bytes
FP16_BYTES = 2
FP32_BYTES = 4
CUDA_OLD_ROW_THRESHOLD = 128
"""qlinear_cuda_old.QuantLinear's ``kernel_switch_threshold`` default: rows from which eager dequantization runs."""
CUDA_OLD_INSTRUCTIONS_PER_WEIGHT = 39 / 8
"""``VecQuant4MatMulKernelFaster_old``'s instructions for 8 weights of one row, counted from its source."""
EAGER_DEQUANT_BYTES_PER_WEIGHT = (("shift", INT4_BYTES + 4), ("to_int8", 4 + 1), ("mask", 1 + 1), ("sub_zeros", 1 + 1),
                                  ("scale", 1 + FP16_BYTES))
"""qlinear_cuda_old's dequantization from 128 rows, one eager operator each: (what, HBM bytes read and written a weight)."""
EXLLAMA_RECONSTRUCT_ROWS = 8
"""AutoGPTQ's ``matmul_recons_thd`` for exllama: rows from which the fp16 weight is reconstructed for cuBLAS."""
EXLLAMA_INSTRUCTIONS_PER_WEIGHT = 44 / 8
"""exllama's ``dot_product_8`` instructions for 8 weights of one row, counted from its source."""


def _dequantizing_gemv(name: str, *, rows: float, weight_elements: float, d_in: float, d_out: float, out_bytes: float,
                       instructions_per_weight: float, compute_bytes: float) -> Kernel:
    """One launch that reads and dequantizes every weight once per row on the CUDA cores (its multiply-adds are among
    its instructions, not tensor-core FLOPs)."""
    return Kernel(name=name, kind=KernelKind.MEMORY, flops=0,
                  bytes=rows * (weight_elements * INT4_BYTES + d_in * compute_bytes + d_out * out_bytes),
                  instructions=rows * weight_elements * instructions_per_weight)


def _gemm_from_fp16_copy(name: str, *, rows: float, weight_elements: float, d_in: float, d_out: float,
                         compute_bytes: float) -> Kernel:
    """A cuBLAS GEMM over the dequantized 16-bit copy of the weights."""
    return Kernel(name=name, kind=KernelKind.MATMUL, flops=2 * rows * d_in * d_out, linear=True,
                  bytes=weight_elements * FP16_BYTES + rows * (d_in + d_out) * compute_bytes)


def gptq_linear_kernels(name: str, *, rows: float, d_in: float, d_out: float, train: TrainConfig, weights: float = 1.0) -> list[Kernel]:
    """``rows`` input rows through ``weights`` int4 ``d_in × d_out`` matrices as the serving config's
    GPTQ kernel runs them (module doc); ``train``'s weight kernel must not be fused."""
    kernel, e = train.workload.serving.weight_kernel, train.compute_dtype.bytes
    elements = weights * d_in * d_out
    shape = {"rows": rows, "weight_elements": elements, "d_in": d_in, "d_out": d_out, "compute_bytes": e}
    if kernel is WeightKernel.AUTOGPTQ_CUDA_OLD:
        if rows < CUDA_OLD_ROW_THRESHOLD:
            return [Kernel(name=f"{name}_zero_fill", kind=KernelKind.MEMORY, flops=0, bytes=rows * d_out * FP32_BYTES),
                    _dequantizing_gemv(name, out_bytes=FP32_BYTES, instructions_per_weight=CUDA_OLD_INSTRUCTIONS_PER_WEIGHT, **shape),
                    Kernel(name=f"{name}_to_fp16", kind=KernelKind.MEMORY, flops=0, bytes=rows * d_out * (FP32_BYTES + FP16_BYTES))]
        dequant = [Kernel(name=f"{name}_dequant_{op}", kind=KernelKind.MEMORY, flops=0, bytes=elements * per_weight)
                   for op, per_weight in EAGER_DEQUANT_BYTES_PER_WEIGHT]
        return [*dequant, _gemm_from_fp16_copy(name, **shape)]
    if kernel is WeightKernel.EXLLAMA:
        if rows < EXLLAMA_RECONSTRUCT_ROWS:
            return [_dequantizing_gemv(name, out_bytes=FP16_BYTES, instructions_per_weight=EXLLAMA_INSTRUCTIONS_PER_WEIGHT, **shape)]
        return [Kernel(name=f"{name}_reconstruct", kind=KernelKind.MEMORY, flops=0, bytes=elements * (INT4_BYTES + FP16_BYTES)),
                _gemm_from_fp16_copy(name, **shape)]
    raise ValueError(f"{kernel.value} is the fused kernel: serving_kernels.linear_kernels costs it")
