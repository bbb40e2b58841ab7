"""The kernels of one transformer layer, one micro-batch, on one device, under a layout.

This is the fused-kernel view the step simulator costs (GEMMs, the attention core,
and the memory-bound fused elementwise kernels as Megatron-LM and XLA run them), not
the primitive-level OpGraph: an unfused primitive graph would count every elementwise
op's HBM round trip. Its matmul FLOPs equal the OpGraph's (checked in tests).

Dimension letters: b micro-batch, s sequence on this device (seq_len / cp), h width,
a query heads, k kv heads, d head width, f MLP width, t tensor-parallel degree.

>>> from costmodel.model_config import ModelConfig
>>> m = ModelConfig(name="m", hidden_size=1024, num_layers=2, num_heads=16, ffn_size=4096, vocab_size=1000, mlp="gelu")
>>> ks = layer_forward_kernels(m, TrainConfig(seq_len=512), Layout(tp=2, micro_batch=1))
>>> sum(k.flops for k in ks if k.kind is KernelKind.MATMUL) == 2 * 512 * (4 * 1024**2 + 2 * 1024 * 4096) / 2
True
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat

from costmodel.layout import Attention, Layout, Recompute
from costmodel.model_config import ModelConfig, Norm, Positions
from costmodel.train_config import TrainConfig

# Passes over the S×S score matrix in materialized attention (Megatron's fused
# scale-mask-softmax reads scores and writes probabilities; dropout reads them, writes
# the dropped probabilities and a mask).
_MATERIALIZED_SCORE_PASSES = 5
# HBM passes (reads + writes of one compute-dtype tensor) of the residual-stream and MLP
# elementwise work, fused into one kernel or run op by op as eager PyTorch does. Eager
# RMSNorm upcasts to fp32 and runs pow, mean, rsqrt, mul, cast and the weight multiply as
# separate kernels; eager RoPE goes through complex fp32 views; LayerNorm and GELU are
# single native kernels either way.
_PASSES = {
    # kernel: (fused, eager)
    "layernorm": (2, 2),
    "rmsnorm": (2, 14),
    "rope": (2, 10),
    "gelu": (2, 2),
    "relu": (2, 2),
    "swiglu": (3, 5),
    "geglu": (3, 5),
}


def _passes(kernel: str, layout: Layout) -> int:
    fused, eager = _PASSES[kernel]
    return fused if layout.fused_elementwise else eager


# Flash attention backward recomputes the scores: 2.5× the forward matmul work
# (Dao 2023, FlashAttention-2 section 3.2: forward 4·s²·d, backward 10·s²·d per head).
FLASH_BACKWARD_FLOPS_RATIO = 2.5


class KernelKind(StrEnum):
    """How a kernel is limited: tensor-core GEMM, fused attention, or HBM bandwidth."""

    MATMUL = "matmul"
    FLASH_ATTENTION = "flash_attention"
    MEMORY = "memory"


class Kernel(BaseModel):
    """One kernel launch's work on one device."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="What it computes, e.g. 'qkv', 'mlp_down', 'softmax'.")
    kind: KernelKind = Field(description="Which roofline limits it.")
    flops: NonNegativeFloat = Field(description="Floating-point operations of one launch on this device.")
    bytes: NonNegativeFloat = Field(description="HBM bytes read plus written by one launch on this device.")
    in_attention_core: bool = Field(False, description="Recomputed by selective recompute (scores, softmax, dropout, attention·V).")
    count: NonNegativeFloat = Field(1.0, description="Launches of this kernel (may be fractional: an average over layers).")

    def scaled(self, factor: float) -> Kernel:
        """The same kernel launched ``factor`` times as often (same size per launch)."""
        return self.model_copy(update={"count": self.count * factor})

    @property
    def total_flops(self) -> float:
        return self.flops * self.count


def _matmul(name: str, m: float, n: float, k: float, *, elem_bytes: int, batch: float = 1.0, core: bool = False) -> Kernel:
    """A (batched) GEMM [m,k]×[k,n]: 2mnk FLOPs, operands and result read/written once."""
    return Kernel(
        name=name, kind=KernelKind.MATMUL, flops=2 * batch * m * n * k,
        bytes=batch * elem_bytes * (m * k + k * n + m * n), in_attention_core=core,
    )


def _memory(name: str, elements: float, passes: float, *, elem_bytes: int, core: bool = False) -> Kernel:
    """An elementwise/normalisation kernel moving ``passes`` tensors of ``elements``."""
    return Kernel(name=name, kind=KernelKind.MEMORY, flops=elements * passes, bytes=elements * passes * elem_bytes, in_attention_core=core)


def uses_dropout(model: ModelConfig) -> bool:
    """GPT-2/Megatron-style models train with dropout; Llama-style (RMSNorm) ones do not."""
    return model.norm is Norm.LAYERNORM


def local_widths(model: ModelConfig, train: TrainConfig, layout: Layout) -> tuple[float, float, float]:
    """(tokens of one micro-batch, query width, key/value width) on one device."""
    d, t = model.head_dim, layout.tp
    return layout.micro_batch * train.seq_len / layout.cp, model.num_heads * d / t, model.num_kv_heads * d / t


def layer_forward_kernels(model: ModelConfig, train: TrainConfig, layout: Layout) -> list[Kernel]:
    """The forward kernels of one layer for one micro-batch on one device."""
    e = train.compute_dtype.bytes
    t = layout.tp
    h = model.hidden_size
    tokens, q_width, kv_width = local_widths(model, train, layout)
    # Without sequence parallelism every tp rank runs the residual-stream kernels in full.
    residual_tokens = tokens / t if layout.sequence_parallel else tokens
    dropout_passes = 3 if uses_dropout(model) else 0
    norm_passes = _passes(model.norm, layout)
    kernels = [
        _memory("attn_norm", residual_tokens * h, norm_passes, elem_bytes=e),
        _matmul("qkv", tokens, q_width + 2 * kv_width, h, elem_bytes=e),
    ]
    if model.positions is Positions.ROPE:
        kernels.append(_memory("rope", tokens * (q_width + kv_width), _passes("rope", layout), elem_bytes=e))
    return kernels + [
        *_attention_core(model, train, layout),
        _matmul("attn_out", tokens, h, q_width, elem_bytes=e),
        _memory("attn_residual", residual_tokens * h, 3 + dropout_passes, elem_bytes=e),
        _memory("mlp_norm", residual_tokens * h, norm_passes, elem_bytes=e),
        *_mlp(model, tokens, layout, elem_bytes=e),
        _memory("mlp_residual", residual_tokens * h, 3 + dropout_passes, elem_bytes=e),
    ]


def _attention_core(model: ModelConfig, train: TrainConfig, layout: Layout) -> list[Kernel]:
    e = train.compute_dtype.bytes
    heads = model.num_heads / layout.tp
    s_q = train.seq_len / layout.cp
    s_kv = train.seq_len  # context parallel: each query chunk still meets every key
    b, d = layout.micro_batch, model.head_dim
    if layout.attention is Attention.FLASH:
        # Causal flash kernels skip blocks above the diagonal: half the score work.
        flops = 0.5 * 4 * b * heads * s_q * s_kv * d
        kv_heads = model.num_kv_heads / layout.tp
        io_bytes = e * b * s_q * d * (2 * heads) + e * b * s_kv * d * 2 * kv_heads
        return [Kernel(name="flash_attention", kind=KernelKind.FLASH_ATTENTION, flops=flops, bytes=io_bytes, in_attention_core=True)]
    scores = b * heads * s_q * s_kv
    passes = _MATERIALIZED_SCORE_PASSES if uses_dropout(model) else 2
    return [
        _matmul("scores", s_q, s_kv, d, elem_bytes=e, batch=b * heads, core=True),
        _memory("softmax_dropout", scores, passes, elem_bytes=e, core=True),
        _matmul("attn_v", s_q, d, s_kv, elem_bytes=e, batch=b * heads, core=True),
    ]


def _mlp(model: ModelConfig, tokens: float, layout: Layout, *, elem_bytes: int) -> list[Kernel]:
    h, t = model.hidden_size, layout.tp
    n_in = 2 if model.mlp.gated else 1
    act_passes = _passes(model.mlp, layout)
    if not model.is_moe:
        f = model.ffn_size / t
        return [
            _matmul("mlp_in", tokens, n_in * f, h, elem_bytes=elem_bytes),
            _memory("mlp_activation", tokens * f, act_passes, elem_bytes=elem_bytes),
            _matmul("mlp_out", tokens, h, f, elem_bytes=elem_bytes),
        ]
    # Each token visits top-k experts; expert weights are split over tp like a dense MLP.
    routed = tokens * model.experts_per_token
    f = model.moe_ffn_size / t
    kernels = [
        _matmul("router", tokens, model.num_experts, h, elem_bytes=elem_bytes),
        _memory("dispatch", routed * h, 2, elem_bytes=elem_bytes),
        _matmul("expert_in", routed, n_in * f, h, elem_bytes=elem_bytes),
        _memory("expert_activation", routed * f, act_passes, elem_bytes=elem_bytes),
        _matmul("expert_out", routed, h, f, elem_bytes=elem_bytes),
        _memory("combine", routed * h, 2, elem_bytes=elem_bytes),
    ]
    if model.shared_expert_ffn_size:
        fs = model.shared_expert_ffn_size / t
        kernels += [
            _matmul("shared_in", tokens, n_in * fs, h, elem_bytes=elem_bytes),
            _memory("shared_activation", tokens * fs, act_passes, elem_bytes=elem_bytes),
            _matmul("shared_out", tokens, h, fs, elem_bytes=elem_bytes),
        ]
    return kernels


def head_forward_kernels(model: ModelConfig, train: TrainConfig, layout: Layout) -> list[Kernel]:
    """Final norm, vocabulary projection and cross-entropy (fp32 logits), vocab split over tp."""
    e = train.compute_dtype.bytes
    tokens = layout.micro_batch * train.seq_len / layout.cp
    v = model.vocab_size / layout.tp
    return [
        _memory("final_norm", tokens * model.hidden_size, _passes(model.norm, layout), elem_bytes=e),
        _matmul("lm_head", tokens, v, model.hidden_size, elem_bytes=e),
        _memory("cross_entropy", tokens * v, 3, elem_bytes=4),
    ]


def embedding_forward_kernels(model: ModelConfig, train: TrainConfig, layout: Layout) -> list[Kernel]:
    """Token (and position) embedding lookup: a gather writing the residual stream."""
    e = train.compute_dtype.bytes
    tokens = layout.micro_batch * train.seq_len / layout.cp
    return [_memory("embedding", tokens * model.hidden_size, 3, elem_bytes=e)]


def recomputed_kernels(kernels: list[Kernel], recompute: Recompute) -> list[Kernel]:
    """The share of a layer's forward ``kernels`` that ``recompute`` re-runs in backward.

    >>> k = Kernel(name="qkv", kind=KernelKind.MATMUL, flops=10.0, bytes=1.0)
    >>> [r.total_flops for r in recomputed_kernels([k], Recompute.SELECTIVE_OP)]
    [5.0]
    """
    if recompute is Recompute.FULL:
        return list(kernels)
    if recompute is Recompute.SELECTIVE_LAYER:
        return [k.scaled(0.5) for k in kernels]  # every second layer recomputed in full
    if recompute is Recompute.SELECTIVE:
        return [k for k in kernels if k.in_attention_core]
    if recompute is Recompute.SELECTIVE_OP:
        # Matmul and attention outputs are kept, except every second matmul's.
        return [k.scaled(0.5) if k.kind is KernelKind.MATMUL else k for k in kernels if k.kind is not KernelKind.FLASH_ATTENTION]
    return []


def recomputed_forward_comm_fraction(layout: Layout) -> float:
    """Share of a layer's forward tensor/expert-parallel collectives re-issued by recompute.

    Per-op checkpointing keeps reduce-scatter outputs but not all-gathers: with sequence
    parallelism, recomputing every second matmul re-gathers the inputs of two of the
    layer's four collectives.
    """
    if layout.recompute is Recompute.SELECTIVE_OP:
        return 0.5 if layout.sequence_parallel else 0.0
    return {Recompute.FULL: 1.0, Recompute.SELECTIVE_LAYER: 0.5}.get(layout.recompute, 0.0)
