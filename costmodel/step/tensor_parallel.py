"""Tensor-parallel collectives of one layer for one micro-batch on one device.

Each of a layer's two blocks (attention, MLP) opens with a column-parallel GEMM and closes
with a row-parallel one (Megatron-LM). Forward all-reduces the block's output; with
sequence parallelism an all-gather of the block's input and a reduce-scatter of its
output move the same bytes. Backward runs the conjugates: the column-parallel input
gradient is all-reduced (reduce-scattered with sequence parallelism) and, with sequence
parallelism, the row-parallel output gradient all-gathered. Recompute re-issues part of
the forward ones (`costmodel.step.recompute.recomputed_forward_comm_fraction`). Where the
stack runs one GEMM per weight matrix (``SoftwareStack.fused_projections`` off), each
matrix's partial input gradient is all-reduced on its own (`column_parallel_reductions`):
the count the op-level model finds in the traced program's graph.

Two facts of the software stack change what this costs:

- ``SoftwareStack.tp_overlap``. ``backward`` (Megatron-LM's asynchronous tensor-parallel
  communication): the column-parallel input gradient is reduced behind that GEMM's
  weight-gradient GEMM; with sequence parallelism Megatron keeps only its shard of the
  block input and re-gathers it in backward behind the input-gradient GEMM; the
  row-parallel gathers and every forward collective stay exposed. ``gemm``
  (TransformerEngine's userbuffer overlap, XLA's collective matmul): every collective is
  cut into chunks pipelined with the GEMM beside it — forward gathers with the
  column-parallel GEMM they feed, reductions with the row-parallel GEMM that produces them,
  and in backward each with its input- or weight-gradient GEMM. A hidden collective still
  slows the GEMM beside it (``Efficiency.overlap_slowdown``). ``collective-matmul`` (XLA's
  windowed einsum) is ``gemm`` under sequence parallelism on a GPU and ``none`` otherwise
  (`TpOverlap.under`).
- ``SoftwareStack.batch_major`` ([batch, seq, hidden] activations, as torchtitan's DTensor
  sequence parallelism has them): gathering or scattering the inner sequence axis copies
  the buffer into or out of NCCL's contiguous layout when micro_batch > 1.

>>> from costmodel.step.collectives import Tier
>>> from costmodel.step.kernels import layer_forward_kernels
>>> from costmodel.hardware.machine import Machine
>>> from costmodel.inputs.model_config import ModelConfig
>>> from costmodel.inputs.stack import stack_with
>>> m = ModelConfig(name="m", hidden_size=4096, num_layers=2, num_heads=32, ffn_size=16384, vocab_size=1000, mlp="gelu")
>>> hw = Machine(name="x", peak_flops_per_s=3e14, hbm_bytes_per_s=2e12, hbm_bytes=8e10,
...              devices_per_node=8, intra=Tier(bytes_per_s=2e11, latency_s=0), inter=Tier(bytes_per_s=2e10, latency_s=0))
>>> train, lay = TrainConfig(seq_len=2048), Layout(tp=8)
>>> plain = tensor_parallel_costs(m, train, lay, hw, layer_forward_kernels(m, train, lay))
>>> overlapped = tensor_parallel_costs(m, train, lay.model_copy(update={"stack": stack_with("jax", tp_overlap="backward")}),
...                                   hw, layer_forward_kernels(m, train, lay))
>>> plain.backward_exposed_s == 2 * plain.forward_s > 0  # wq, wk, wv and w_in reduce their input gradients apart
True
>>> fused = stack_with("jax", tp_overlap="backward", fused_projections=True)
>>> fused_costs = tensor_parallel_costs(m, train, lay.model_copy(update={"stack": fused}), hw, layer_forward_kernels(m, train, lay))
>>> fused_costs.backward_exposed_s < plain.forward_s / 2
True
>>> 0 < overlapped.backward_exposed_s < plain.backward_exposed_s  # three reductions outlast the QKV weight gradient
True
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat

from costmodel.hardware.machine import Machine
from costmodel.hardware.profile import DeviceKind
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import TpOverlap
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.collectives import all_gather_s, all_reduce_s, exposed_s
from costmodel.step.kernels import Kernel
from costmodel.step.recompute import recomputed_forward_comm_fraction
from costmodel.step.roofline import kernel_time_s

# The GEMM that opens each block (its input is gathered) and the one that closes it (its
# output is reduced): the GEMMs each block's collectives hide behind.
_COLUMN_PARALLEL = frozenset({"qkv", "mlp_in", "expert_in"})
_ROW_PARALLEL = frozenset({"attn_out", "mlp_out", "expert_out"})


class TensorParallelCost(BaseModel):
    """Seconds of one layer's tensor-parallel collectives (and their buffer copies)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    forward_s: NonNegativeFloat = Field(description="Forward collectives, overlapped or not.")
    forward_exposed_s: NonNegativeFloat = Field(description="The part of forward_s not hidden behind GEMMs.")
    backward_s: NonNegativeFloat = Field(description="Backward and recompute collectives, overlapped or not.")
    backward_exposed_s: NonNegativeFloat = Field(description="The part of backward_s not hidden behind gradient GEMMs.")


def column_parallel_reductions(model: ModelConfig, layout: Layout) -> dict[str, int]:
    """Column-parallel GEMM (by its `costmodel.step.kernels` name) → partial input gradients of
    it that backward all-reduces over the tensor-parallel group, per layer and micro-batch.

    Fused projections (Megatron-LM's linear_qkv and linear_fc1): one per block. Otherwise
    one per weight matrix the tensor-parallel group splits: q, k and v (k and v only where
    tp divides the KV heads, else they stay whole), the MLP's input and gate, the shared
    expert's likewise; an MoE layer's routed experts run as one tensor-parallel region
    whose input gradient is summed once (`validate.mesh_hooks.expert_region`).

    >>> from costmodel.inputs.stack import stack_with
    >>> m = ModelConfig(name="m", hidden_size=4096, num_layers=2, num_heads=32, num_kv_heads=8, ffn_size=14336, vocab_size=8)
    >>> column_parallel_reductions(m, Layout(tp=8)), column_parallel_reductions(m, Layout(tp=8, stack=stack_with("megatron-core")))
    ({'qkv': 3, 'mlp_in': 2}, {'qkv': 1, 'mlp_in': 1})
    """
    mlp = "expert_in" if model.is_moe else "mlp_in"
    if layout.stack.fused_projections:
        return {"qkv": 1, mlp: 1}
    n_in = 2 if model.mlp.gated else 1
    kv_split = model.num_kv_heads % layout.tp == 0
    out = {"qkv": 1 + 2 * kv_split, mlp: 1 if model.is_moe else n_in}
    if model.is_moe and model.shared_expert_ffn_size:
        out["shared_in"] = n_in
    return out


def tensor_parallel_costs(model: ModelConfig, train: TrainConfig, layout: Layout, hw: Machine,
                          kernels: list[Kernel]) -> TensorParallelCost:
    """Tensor-parallel seconds of one layer whose forward ``kernels`` are given (0 when tp = 1)."""
    if layout.tp == 1:
        return TensorParallelCost(forward_s=0.0, forward_exposed_s=0.0, backward_s=0.0, backward_exposed_s=0.0)
    group = hw.groups(layout)["tp"]
    act_bytes = layout.micro_batch * train.seq_len / layout.cp * model.hidden_size * train.compute_dtype.bytes
    sp = layout.sequence_parallel
    if sp:
        copy_s = hw.stream_s(2 * act_bytes) if layout.stack.batch_major and layout.micro_batch > 1 else 0.0
        one_s = all_gather_s(act_bytes, group) + copy_s  # one all-gather or reduce-scatter
        forward_s = 4 * one_s
    else:
        one_s = all_reduce_s(act_bytes, group)  # one all-reduce
        forward_s = 2 * one_s
    recompute_share = recomputed_forward_comm_fraction(layout)
    overlap = layout.stack.tp_overlap.under(sequence_parallel=sp, windowed_einsum=hw.device_kind is DeviceKind.GPU)
    columns = column_parallel_reductions(model, layout)
    # Sequence parallelism reduce-scatters each block's input gradient once (see the module docstring).
    column_s = 2 * one_s if sp else sum(columns.values()) * one_s
    if overlap is TpOverlap.NONE:
        backward_s = (forward_s if sp else column_s) + forward_s * recompute_share
        return TensorParallelCost(forward_s=forward_s, forward_exposed_s=forward_s, backward_s=backward_s, backward_exposed_s=backward_s)
    slowdown = hw.efficiency.overlap_slowdown

    def gemm_s(name: str) -> float:
        return sum(kernel_time_s(k, peak_flops_per_s=hw.linear_peak, hbm_bytes_per_s=hw.hbm_bytes_per_s, efficiency=hw.efficiency)
                   for k in kernels if k.name == name)

    def behind(names: frozenset[str]) -> float:
        """Exposed seconds of one collective beside each GEMM in ``names`` (one per block)."""
        return sum(exposed_s(one_s, gemm_s(k.name), slowdown) for k in kernels if k.name in names)

    if sp:
        # Backward: per block a row-parallel gather of the output gradient, a re-gather of the
        # block input (Megatron keeps only its shard) and a reduce-scatter of the input gradient.
        backward_s = 6 * one_s
        forward_exposed = behind(_COLUMN_PARALLEL) + behind(_ROW_PARALLEL) if overlap is TpOverlap.GEMM else forward_s
        column_exposed = 2 * behind(_COLUMN_PARALLEL)
        row_exposed = behind(_ROW_PARALLEL) if overlap is TpOverlap.GEMM else 2 * one_s
    else:
        backward_s = column_s
        forward_exposed = behind(_ROW_PARALLEL) if overlap is TpOverlap.GEMM else forward_s
        column_exposed, row_exposed = sum(exposed_s(n * one_s, gemm_s(name), slowdown) for name, n in columns.items()), 0.0
    recompute_s, recompute_exposed = forward_s * recompute_share, forward_exposed * recompute_share
    return TensorParallelCost(forward_s=forward_s, forward_exposed_s=forward_exposed, backward_s=backward_s + recompute_s,
                              backward_exposed_s=column_exposed + row_exposed + recompute_exposed)
