"""The XLA options the reference program is compiled with, per platform: the overlaps the `jax` stack claims.

The `jax` stack's tensor-parallel overlap (`costmodel.inputs.stack.TpOverlap.COLLECTIVE_MATMUL`)
is XLA's windowed einsum: the SPMD partitioner turns an all-gather feeding a GEMM and a
GEMM's reduce-scatter into loops of collective-permutes and partial GEMMs, which the GPU
runs on separate streams. XLA does so only above a size threshold, by default never on a
GPU; these options set it to every size, as NVIDIA's JAX-Toolbox documents for tensor-parallel
overlap (rosetta/docs/GPU_performance.md and its collective-matmul unit test). The validator
and the multi-host runner pass them to ``compile``; `plan` prints them as ``XLA_FLAGS`` for a
user's own program. On the CPU they change nothing (the options are a GPU backend's).

>>> from costmodel.inputs.layout import Layout
>>> sorted(compile_options(Layout(tp=8, sequence_parallel=True), "gpu"))
['xla_gpu_multi_streamed_windowed_einsum', 'xla_gpu_threshold_for_windowed_einsum_mib']
>>> compile_options(Layout(tp=8, sequence_parallel=True), "cpu")
{}
"""

from __future__ import annotations

from typing import Any

from costmodel.inputs.layout import Layout
from costmodel.inputs.stack import TpOverlap

COLLECTIVE_MATMUL: dict[str, dict[str, Any]] = {
    "gpu": {"xla_gpu_threshold_for_windowed_einsum_mib": 0, "xla_gpu_multi_streamed_windowed_einsum": True},
}
"""Per platform, the XLA options that decompose tensor-parallel collectives beside GEMMs."""


def compile_options(layout: Layout, platform: str) -> dict[str, Any]:
    """The options to compile ``layout``'s step with on ``platform`` ("gpu", "tpu", "cpu"): collective matmul where
    the stack claims it and the layout has sequence-parallel tensor axes (`TpOverlap.under`).

    >>> compile_options(Layout(tp=8, sequence_parallel=False), "gpu")
    {}
    """
    claimed = layout.tp > 1 and layout.sequence_parallel and layout.stack.tp_overlap is TpOverlap.COLLECTIVE_MATMUL
    return dict(COLLECTIVE_MATMUL.get(platform, {})) if claimed else {}


def xla_flags(options: dict[str, Any]) -> str:
    """``options`` as the ``XLA_FLAGS`` environment variable spells them.

    >>> xla_flags({"xla_gpu_threshold_for_windowed_einsum_mib": 0, "xla_gpu_multi_streamed_windowed_einsum": True})
    '--xla_gpu_threshold_for_windowed_einsum_mib=0 --xla_gpu_multi_streamed_windowed_einsum=true'
    """
    return " ".join(f"--{name}={str(value).lower() if isinstance(value, bool) else value}" for name, value in options.items())
