"""Seconds one transformer layer costs for one micro-batch on one device.

Kernels come from `costmodel.step.kernels`, their times from the roofline; the collectives a
layer issues (tensor, context and expert parallel) from `costmodel.step.collectives` on the
layout's groups. Tensor-parallel collectives sit between dependent GEMMs; they hide
behind GEMMs only as far as the software overlaps them (`costmodel.step.tensor_parallel`).
The context-parallel ring overlaps the attention it feeds.

>>> from costmodel.step.collectives import Tier
>>> from costmodel.hardware.machine import Machine
>>> from costmodel.inputs.model_config import ModelConfig
>>> m = ModelConfig(name="m", hidden_size=1024, num_layers=2, num_heads=16, ffn_size=4096, vocab_size=1000)
>>> hw = Machine(name="x", peak_flops_per_s=1e14, hbm_bytes_per_s=1e12, hbm_bytes=8e10,
...              devices_per_node=8, intra=Tier(bytes_per_s=1e11, latency_s=0), inter=Tier(bytes_per_s=1e10, latency_s=0))
>>> c = layer_costs(m, TrainConfig(seq_len=1024), Layout(tp=2), hw)
>>> c.backward.compute_s > c.forward.compute_s > 0 and c.tp_forward_s > 0
True
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat

from costmodel.hardware.machine import Machine
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.collectives import all_to_all_s, exposed_s, p2p_s
from costmodel.step.kernels import Kernel, KernelKind, layer_forward_kernels, local_widths
from costmodel.step.recompute import recomputed_forward_comm_fraction, recomputed_kernels
from costmodel.step.roofline import kernel_time_s
from costmodel.step.tensor_parallel import tensor_parallel_costs


class Phase(BaseModel):
    """Seconds split into GEMM/attention-bound and HBM-bound kernels."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    compute_s: NonNegativeFloat = 0.0
    memory_s: NonNegativeFloat = 0.0

    @property
    def total_s(self) -> float:
        return self.compute_s + self.memory_s


def cotangent_transpose_s(kernel: Kernel, hw: Machine) -> float:
    """Seconds the backward of ``kernel`` spends copying its output's gradient transposed before
    the weight-gradient GEMM, on a machine whose compiler does (`costmodel.hardware.profile.GradientTranspose`);
    a frozen matrix's GEMM (no weight gradient) copies nothing.

    >>> from costmodel.step.collectives import Tier
    >>> from costmodel.hardware.profile import GradientTranspose
    >>> hw = Machine(name="cpu", peak_flops_per_s=1e11, hbm_bytes_per_s=1e10, hbm_bytes=8e9, devices_per_node=1,
    ...              intra=Tier(bytes_per_s=1e10, latency_s=0), inter=Tier(bytes_per_s=1e10, latency_s=0),
    ...              gradient_transpose=GradientTranspose(plain_s_per_byte=1e-10, fused_s_per_byte=1e-9))
    >>> k = Kernel(name="mlp_in", kind=KernelKind.MATMUL, flops=1e9, bytes=1e7, cotangent_bytes=4e6, cotangent_fused=True)
    >>> cotangent_transpose_s(k, hw), cotangent_transpose_s(k.model_copy(update={"backward_scale": 1.0}), hw)
    (0.004, 0.0)
    """
    transpose = hw.gradient_transpose
    if transpose is None or kernel.backward_scale < 2:
        return 0.0
    s_per_byte = transpose.fused_s_per_byte if kernel.cotangent_fused else transpose.plain_s_per_byte
    return kernel.count * kernel.cotangent_bytes * s_per_byte


def phase_time(kernels: list[Kernel], hw: Machine, *, backward: bool = False) -> Phase:
    """Roofline time of ``kernels`` run once (forward) or differentiated (backward, each kernel
    ``backward_scale`` times its forward work)."""
    compute_s = memory_s = 0.0
    for k in kernels:
        if backward:
            memory_s += cotangent_transpose_s(k, hw)
            k = k.scaled(k.backward_scale)
        peak = hw.linear_peak if k.linear else hw.peak_flops_per_s
        t = kernel_time_s(k, peak_flops_per_s=peak, hbm_bytes_per_s=hw.hbm_bytes_per_s, efficiency=hw.efficiency)
        if k.kind is KernelKind.MEMORY:
            memory_s += t
        else:
            compute_s += t
    return Phase(compute_s=compute_s, memory_s=memory_s)


class LayerCosts(BaseModel):
    """One layer, one micro-batch, one device: kernel time and the collectives it waits on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    forward: Phase = Field(description="Forward kernels.")
    backward: Phase = Field(description="Backward kernels.")
    recompute: Phase = Field(description="Forward kernels re-run in backward by the recompute policy.")
    tp_forward_s: NonNegativeFloat = Field(description="Tensor-parallel collectives in forward, hidden or not.")
    tp_forward_exposed_s: NonNegativeFloat = Field(description="The part of tp_forward_s not hidden behind GEMMs.")
    tp_backward_s: NonNegativeFloat = Field(description="Tensor-parallel collectives in backward (and recompute), hidden or not.")
    tp_backward_exposed_s: NonNegativeFloat = Field(description="The part of tp_backward_s not hidden behind gradient GEMMs.")
    cp_total_s: NonNegativeFloat = Field(description="Context-parallel ring transfers, forward and backward.")
    cp_exposed_s: NonNegativeFloat = Field(description="Part of cp_total_s not hidden behind attention.")
    ep_forward_s: NonNegativeFloat = Field(description="Expert all-to-alls in forward.")
    ep_backward_s: NonNegativeFloat = Field(description="Expert all-to-alls in backward.")

    @property
    def forward_s(self) -> float:
        return self.forward.total_s + self.tp_forward_exposed_s + self.cp_exposed_s / 3 + self.ep_forward_s

    @property
    def backward_s(self) -> float:
        return (self.backward.total_s + self.recompute.total_s + self.tp_backward_exposed_s
                + 2 * self.cp_exposed_s / 3 + self.ep_backward_s)

    @property
    def exposed_comm_s(self) -> float:
        return self.tp_forward_exposed_s + self.tp_backward_exposed_s + self.cp_exposed_s + self.ep_forward_s + self.ep_backward_s


def layer_costs(model: ModelConfig, train: TrainConfig, layout: Layout, hw: Machine) -> LayerCosts:
    """Cost one layer of ``model`` for one micro-batch under ``layout`` on ``hw``."""
    groups = hw.groups(layout)
    e = train.compute_dtype.bytes
    tokens, _, kv_width = local_widths(model, train, layout)
    kernels = layer_forward_kernels(model, train, layout)
    core = [k for k in kernels if k.in_attention_core]
    forward = phase_time(kernels, hw)
    recompute = phase_time(recomputed_kernels(kernels, model, layout), hw)
    comm_repeat = recomputed_forward_comm_fraction(layout)
    tp = tensor_parallel_costs(model, train, layout, hw, kernels)
    # Context parallel: each device passes its K/V chunk round the ring, cp-1 hops, in
    # forward and twice in backward (K/V and their gradients).
    kv_bytes = 2 * tokens * kv_width * e
    cp_group = groups["cp"]
    hop_tier = cp_group.inter if cp_group.n_nodes > 1 else cp_group.intra
    ring_s = (layout.cp - 1) * p2p_s(kv_bytes, hop_tier)
    attention_s = phase_time(core, hw).total_s
    ep_pass_s = 0.0
    if model.is_moe and layout.ep > 1:
        routed_bytes = tokens * model.experts_per_token * model.hidden_size * e / layout.tp
        ep_pass_s = 2 * all_to_all_s(routed_bytes, groups["ep"])  # dispatch and combine
    return LayerCosts(
        forward=forward,
        backward=phase_time(kernels, hw, backward=True),
        recompute=recompute,
        tp_forward_s=tp.forward_s,
        tp_forward_exposed_s=tp.forward_exposed_s,
        tp_backward_s=tp.backward_s,
        tp_backward_exposed_s=tp.backward_exposed_s,
        cp_total_s=3 * ring_s,
        cp_exposed_s=3 * exposed_s(ring_s, attention_s, hw.efficiency.overlap_slowdown),
        ep_forward_s=ep_pass_s,
        ep_backward_s=ep_pass_s * (1 + comm_repeat),
    )
