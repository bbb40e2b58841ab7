"""The kernels of one transformer layer, one micro-batch, on one device, under a layout.

This is the fused-kernel view the step simulator costs (GEMMs, the attention core,
and the memory-bound fused elementwise kernels as Megatron-LM and XLA run them). The
op-level model costs the primitive-level OpGraph inside the same kind of fusions
(`costmodel.oplevel.fusion`), so neither counts an elementwise intermediate's HBM round trip.
Its matmul FLOPs equal the OpGraph's (checked in tests).

LoRA fine-tuning (`costmodel.inputs.workload`): a frozen weight's GEMM computes only the input
gradient in backward (``backward_scale`` 1, not 2: the step's frozen matmuls cost 4·N·tokens
instead of 6·N·tokens), and each adapted matrix adds its adapter's two thin GEMMs, ``x·A``
and ``(x·A)·B``, which train like any weight. Under the fp8 recipe the frozen GEMMs (forward
and input gradient) run in fp8 at the fp8 peak and the adapters' GEMMs in the compute dtype.

Dimension letters: b micro-batch, s sequence on this device (seq_len / cp), h width,
a query heads, k kv heads, d head width, f MLP width, t tensor-parallel degree.

>>> from costmodel.inputs.model_config import ModelConfig
>>> m = ModelConfig(name="m", hidden_size=1024, num_layers=2, num_heads=16, ffn_size=4096, vocab_size=1000, mlp="gelu")
>>> ks = layer_forward_kernels(m, TrainConfig(seq_len=512), Layout(tp=2, micro_batch=1))
>>> sum(k.flops for k in ks if k.kind is KernelKind.MATMUL) == 2 * 512 * (4 * 1024**2 + 2 * 1024 * 4096) / 2
True
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat

from costmodel.inputs.layout import Layout, Offload
from costmodel.inputs.model_config import ModelConfig, Norm, Positions
from costmodel.inputs.stack import Attention
from costmodel.inputs.train_config import TrainConfig
from costmodel.inputs.workload import FrozenDtype, norm_params_per_layer
from costmodel.step.fp8_memory import FP8_BYTES

# HBM passes (reads plus writes of one compute-dtype tensor; a one-byte dropout mask is half
# a pass) of each memory-bound kernel, forward and backward, fused into one kernel
# (Megatron-LM's fused kernels, XLA, torch.compile) or run op by op as eager PyTorch does.
# Backward reads what forward saved and the incoming gradient and writes the outgoing one,
# so a norm or activation reads x and dy and writes dx (3 passes to forward's 2). A residual
# add has no backward kernel, but the gradient is summed where the stream forked (3).
# Eager RMSNorm upcasts to fp32 and runs pow, mean, rsqrt, mul, cast and the weight multiply
# as separate kernels; eager RoPE goes through complex fp32 views and back, in both passes.
_PASSES: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {
    # kernel: ((fused forward, fused backward), (eager forward, eager backward))
    "layernorm": ((2, 3), (2, 3)),
    "rmsnorm": ((2, 3), (14, 28)),
    "rope": ((2, 2), (10, 10)),
    "gelu": ((2, 3), (2, 3)),
    "relu": ((2, 3), (2, 3)),
    "swiglu": ((3, 5), (5, 8)),
    "geglu": ((3, 5), (5, 8)),
    "residual": ((3, 3), (3, 3)),
    # Megatron's fused bias-dropout-add writes the sum and a mask; backward reads the
    # gradient and the mask, writes the branch's gradient, and the fork sums (2.5 + 3).
    "dropout_residual": ((3.5, 5.5), (5.5, 5.5)),
    # Materialized attention over the S×S scores: softmax reads scores, writes
    # probabilities; backward reads probabilities and their gradient, writes the scores'.
    "softmax": ((2, 3), (2, 3)),
    # Megatron's fused scale-mask-softmax, then dropout (reads the probabilities, writes the
    # dropped ones and a mask); backward undoes dropout (2.5 passes), then softmax (3).
    "softmax_dropout": ((4.5, 5.5), (4.5, 5.5)),
    "embedding": ((3, 3), (3, 3)),
    "cross_entropy": ((3, 3), (3, 3)),
    # Megatron's vocab-parallel cross-entropy, in fp32 passes over the logits: forward casts
    # them to fp32 (1.5), takes the max (1), subtracts it (2), exponentiates (2), sums (1) and
    # divides into the softmax backward reuses (2); backward multiplies by the loss gradient
    # (2) and casts back to the compute dtype (1.5). Megatron-LM @f2e5db4
    # megatron/core/tensor_parallel/cross_entropy.py (the same steps in @ec20274 mpu/cross_entropy.py).
    "vocab_parallel_cross_entropy": ((9.5, 3.5), (9.5, 3.5)),
    "dispatch": ((2, 2), (2, 2)),
}


_NORMS = frozenset({"layernorm", "rmsnorm"})


def _passes(kernel: str, layout: Layout) -> tuple[float, float]:
    fused, eager = _PASSES[kernel]
    return fused if (layout.stack.fused_norm if kernel in _NORMS else layout.stack.fused_elementwise) else eager


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
    backward_scale: NonNegativeFloat = Field(
        2.0, description="Backward work as a multiple of this forward's (a GEMM's: input and weight gradients, 2).")
    count: NonNegativeFloat = Field(1.0, description="Launches of this kernel (may be fractional: an average over layers).")
    fused: bool = Field(False, description="Runs inside a kernel another op launches (an OpGraph op in a fusion, "
                        "`costmodel.oplevel.fusion`): its bytes count, the launch floor does not.")
    linear: bool = Field(False, description="A linear layer's weight GEMM: runs at the peak of the train config's "
                         "linear dtype (fp8 under the fp8 recipe), not the compute dtype's.")
    cotangent_bytes: NonNegativeFloat = Field(
        0.0, description="Bytes of a GEMM's output: its weight gradient contracts their gradient over the leading dimension.")
    cotangent_fused: bool = Field(False, description="The output's gradient comes from an elementwise backward (activation, "
                                  "softmax, norm, loss) a compiler may fuse into the GEMM's operand copy.")
    instructions: NonNegativeFloat = Field(0.0, description="Thread instructions of CUDA-core arithmetic one launch issues "
                                           "(a kernel that dequantizes weights on its cores: `costmodel.step.weight_kernels`), "
                                           "bounded by the part's issue rate; 0: none counted.")
    stream_efficiency: float = Field(1.0, gt=0, le=1, description="Fraction of its kind's HBM rate the kernel streams its "
                                     "bytes at (a weight-only GEMV's dequantization: `ServingStack.weight_only_stream`).")
    attention_keys: PositiveFloat | None = Field(None, description="A causal fused attention kernel's keys a query row "
                                                 "(sequence, packed document or window): the length its efficiency follows "
                                                 "(`costmodel.step.roofline.Efficiency.flash_attention_at`); None: not set.")

    def scaled(self, factor: float) -> Kernel:
        """The same kernel launched ``factor`` times as often (same size per launch)."""
        return self.model_copy(update={"count": self.count * factor})

    @property
    def total_flops(self) -> float:
        return self.flops * self.count


def _matmul(name: str, m: float, n: float, k: float, *, elem_bytes: int, batch: float = 1.0, core: bool = False,
            cotangent_fused: bool = False) -> Kernel:
    """A (batched) GEMM [m,k]×[k,n]: 2mnk FLOPs, operands and result read/written once."""
    return Kernel(
        name=name, kind=KernelKind.MATMUL, flops=2 * batch * m * n * k,
        bytes=batch * elem_bytes * (m * k + k * n + m * n), in_attention_core=core, cotangent_bytes=batch * m * n * elem_bytes,
        cotangent_fused=cotangent_fused,
    )


def _linear(name: str, m: float, n: float, k: float, *, train: TrainConfig, cotangent_fused: bool = False) -> list[Kernel]:
    """A linear layer's GEMM x[m,k]·W[k,n] at the train config's linear dtype and, under the fp8
    recipe, the casts that feed it (`fp8_cast_kernels`): fp8 operands, a compute-dtype result."""
    e = train.compute_dtype.bytes
    if not train.is_fp8:
        return [_matmul(name, m, n, k, elem_bytes=e, cotangent_fused=cotangent_fused).model_copy(update={"linear": True})]
    gemm = Kernel(name=name, kind=KernelKind.MATMUL, flops=2 * m * n * k, bytes=(m * k + k * n) * FP8_BYTES + m * n * e, linear=True,
                  cotangent_bytes=m * n * e, cotangent_fused=cotangent_fused)
    return [gemm, *fp8_cast_kernels(name, m, n, k, train=train)]


# Transformer Engine's fused cast-transpose (Hopper's fp8 GEMMs take only the "TN" layout, so
# every fp8 operand is written twice, row- and column-major) reads one compute-dtype tensor and
# writes two fp8 ones, and reduces its amax in the same pass: 2 + 2 bytes per element.
FP8_CAST_BYTES_PER_ELEMENT = 4


def fp8_cast_kernels(name: str, m: float, n: float, k: float, *, train: TrainConfig) -> list[Kernel]:
    """The HBM passes that quantize one fp8 GEMM's operands, each its own launch as torchao's
    Float8Linear runs them (Transformer Engine fuses the input's cast into the norm or activation
    before it where it can: counting it apart is the upper bound). Forward casts the input
    x[m,k] and the weight W[k,n]; backward casts the output gradient dy[m,n] (e5m2), so the
    input cast's backward is that one (``backward_scale`` n/k). The weight is cast once per
    micro-batch here (TE caches it over micro-batches, ``is_first_microbatch``: the bound).
    Delayed scaling's amax history and scale update is one small fused kernel per step (not counted).
    A frozen weight stored in fp8 (LoRA, `FrozenDtype.FP8`) is read as stored: no weight cast.

    >>> [(k.bytes, k.backward_scale) for k in fp8_cast_kernels("mlp_out", 10, 20, 30, train=TrainConfig())]
    [(1200.0, 0.6666666666666666), (2400.0, 0.0)]
    >>> lora = TrainConfig(workload="finetune-lora", lora={"frozen_dtype": "fp8"})
    >>> [k.name for k in fp8_cast_kernels("mlp_out", 10, 20, 30, train=lora)]
    ['mlp_out_input_cast']
    """
    per = FP8_CAST_BYTES_PER_ELEMENT * train.compute_dtype.bytes / 2
    input_cast = Kernel(name=f"{name}_input_cast", kind=KernelKind.MEMORY, flops=0, bytes=m * k * per, backward_scale=n / k)
    if train.workload.frozen_dtype is FrozenDtype.FP8:
        return [input_cast]
    return [input_cast, Kernel(name=f"{name}_weight_cast", kind=KernelKind.MEMORY, flops=0, bytes=k * n * per, backward_scale=0.0)]


def _memory(name: str, elements: float, passes: tuple[float, float], *, elem_bytes: int, core: bool = False) -> Kernel:
    """An elementwise/normalisation kernel moving (forward, backward) ``passes`` tensors of ``elements``."""
    forward, backward = passes
    return Kernel(name=name, kind=KernelKind.MEMORY, flops=elements * forward, bytes=elements * forward * elem_bytes,
                  in_attention_core=core, backward_scale=backward / forward)


def uses_dropout(model: ModelConfig, layout: Layout) -> bool:
    """Whether the step runs dropout: GPT-2/Megatron-style (LayerNorm) models train with it,
    Llama-style (RMSNorm) ones do not, and a stack may leave it out (`SoftwareStack.dropout`)."""
    return model.norm is Norm.LAYERNORM and layout.stack.dropout


def holds_master_weights(model: ModelConfig, train: TrainConfig, layout: Layout) -> bool:
    """Whether the trained weights are themselves the fp32 master copy (`SoftwareStack.fp32_weights`,
    with a compute dtype other than fp32). LoRA's few adapter weights keep the mixed-precision
    accounting, an offloaded optimizer its master copy on the host (ZeRO-Offload), and ZeRO 1–2
    with locally formed gradients a compute-dtype copy (`keeps_compute_copy`)."""
    return (layout.stack.fp32_weights and train.param_dtype != train.compute_dtype and train.workload.trains_base_weights
            and layout.offload is not Offload.OPTIMIZER and not keeps_compute_copy(model, train, layout))


def keeps_compute_copy(model: ModelConfig, train: TrainConfig, layout: Layout) -> bool:
    """Whether a stack whose weights are otherwise the fp32 master (`SoftwareStack.fp32_weights`)
    holds them as a compute-dtype copy beside an fp32 master split over data with Adam's moments,
    as Megatron's distributed optimizer does: under ZeRO 1–2 where the step forms its gradients
    locally (`forms_gradients_locally`). The update steps the master's shard, casts it, and gathers
    the copy in the compute dtype (half the fp32 gather); each device keeps 2 bytes per weight
    where the master would take 4 (this project's JAX program: `validate.lowering`).

    >>> from costmodel.inputs.stack import stack_with
    >>> m = ModelConfig(name="m", hidden_size=1024, num_layers=2, num_heads=16, ffn_size=4096, vocab_size=1000)
    >>> t = TrainConfig(seq_len=1024, global_batch=8)
    >>> [keeps_compute_copy(m, t, Layout(dp=4, zero_stage=z, stack=stack_with("jax"))) for z in (0, 1, 2, 3)]
    [False, True, True, False]
    """
    return (layout.stack.fp32_weights and layout.zero_stage in (1, 2) and train.param_dtype != train.compute_dtype
            and not train.optimizer_in_backward and layout.offload is Offload.NONE and forms_gradients_locally(model, train, layout))


def forms_gradients_locally(model: ModelConfig, train: TrainConfig, layout: Layout) -> bool:
    """Whether the step accumulates its gradients locally and reduces them as ZeRO needs: a stack
    that does so (`SoftwareStack.manual_data_parallel`) on a layout the JAX program lowers so
    (`lowers_local_gradients`)."""
    return layout.stack.manual_data_parallel and lowers_local_gradients(model, train, layout)


def lowers_local_gradients(model: ModelConfig, train: TrainConfig, layout: Layout) -> bool:
    """Whether the JAX program can form ``layout``'s gradients locally, whatever the stack: the base
    weights trained over data parallelism, beside tensor parallelism under ZeRO 0–2 (each data
    replica's gradient formed on its own devices, the reductions after the loop). Not under ZeRO 3
    beside tensor axes, nor with context or expert axes, nor in pipelines: in a region manual over
    only some axes, XLA replicates a gather's or reduce-scatter's operand over the others first
    (jax 0.10.2), so those plans keep XLA's reductions inside the loop. Nor for an MoE model beside
    tensor axes, whose experts' region failed to trace inside the per-replica map (jax 0.10.2)."""
    lay = layout
    return (train.workload.trains_base_weights and lay.dp > 1 and lay.pp == lay.cp == lay.ep == 1
            and (lay.tp == 1 or lay.zero_stage < 3 and not model.is_moe))


def mlp_rows_per_token(model: ModelConfig, train: TrainConfig, layout: Layout) -> float:
    """Rows the MLP computes per token: 1 for a dense one; an MoE layer's expert-buffer rows
    (`ModelConfig.expert_slots` under the stack's `SoftwareStack.moe_capacity_factor`)."""
    if not model.is_moe:
        return 1.0
    return model.expert_slots(train.seq_len, layout.stack.moe_capacity_factor) / train.seq_len


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
    residual_passes = _passes("dropout_residual" if uses_dropout(model, layout) else "residual", layout)
    norm_passes = _passes(model.norm, layout)
    kernels = [
        _memory("attn_norm", residual_tokens * h, norm_passes, elem_bytes=e),
        *_linear("qkv", tokens, q_width + 2 * kv_width, h, train=train, cotangent_fused=model.positions is Positions.ROPE),
    ]
    if model.positions is Positions.ROPE:
        kernels.append(_memory("rope", tokens * (q_width + kv_width), _passes("rope", layout), elem_bytes=e))
    kernels += [
        *_attention_core(model, train, layout),
        # Its output's gradient is the residual stream's after the MLP norm's backward.
        *_linear("attn_out", tokens, h, q_width, train=train, cotangent_fused=True),
        _memory("attn_residual", residual_tokens * h, residual_passes, elem_bytes=e),
        _memory("mlp_norm", residual_tokens * h, norm_passes, elem_bytes=e),
        *_mlp(model, tokens, layout, train=train),
        _memory("mlp_residual", residual_tokens * h, residual_passes, elem_bytes=e),
    ]
    if holds_master_weights(model, train, layout):
        kernels.append(weight_cast_kernel(model, train, layout))
    return lora_kernels(kernels, model, train, layout)


# Weight matrices of a layer, each cast by a kernel of its own: q, k, v, o and the MLP's
# (or the routed experts' stacked ones and the router, and a shared expert's).
def _weight_matrices(model: ModelConfig) -> int:
    mlp = 3 if model.mlp.gated else 2
    if not model.is_moe:
        return 4 + mlp
    return 4 + mlp + 1 + (mlp if model.shared_expert_ffn_size else 0)


def weight_cast_kernel(model: ModelConfig, train: TrainConfig, layout: Layout) -> Kernel:
    """Copies of one layer's fp32 weights into the compute dtype, one launch per weight matrix
    (`SoftwareStack.fp32_weights`): each reads 4 B and writes the compute dtype's bytes per
    parameter this device holds (with ZeRO-3, of its shard: the cast precedes the gather). Its
    backward (the gradient's cast to fp32) fuses into the weight-gradient's reduction; full
    recompute re-runs it. The op-level model costs the same casts as the traced program's
    ``convert_element_type`` of each weight.

    >>> from costmodel.inputs.model_config import ModelConfig
    >>> m = ModelConfig(name="m", hidden_size=1024, num_layers=2, num_heads=16, ffn_size=4096, vocab_size=1000, mlp="gelu")
    >>> k = weight_cast_kernel(m, TrainConfig(), Layout(tp=2))
    >>> k.count, k.count * k.bytes == (4 * 1024**2 + 2 * 1024 * 4096) / 2 * 6, k.backward_scale
    (6.0, True, 0.0)
    """
    experts = model.routed_expert_params_per_layer
    matrices = model.params_per_layer - experts - norm_params_per_layer(model)
    params = matrices / layout.tp + experts / (layout.tp * layout.ep)
    if layout.zero_stage == 3:
        params /= layout.zero_shards
    n = _weight_matrices(model)
    return Kernel(name="weight_cast", kind=KernelKind.MEMORY, flops=0, bytes=params * (4 + train.compute_dtype.bytes) / n,
                  count=n, backward_scale=0.0)


def _frozen(k: Kernel) -> Kernel:
    """A weight GEMM of a frozen matrix: its backward computes the input gradient only."""
    return k.model_copy(update={"backward_scale": 1.0}) if k.kind is KernelKind.MATMUL and not k.in_attention_core else k


def lora_kernels(kernels: list[Kernel], model: ModelConfig, train: TrainConfig, layout: Layout) -> list[Kernel]:
    """A layer's forward ``kernels`` as the workload trains them: where the base weights do not train
    (LoRA), weight GEMMs frozen (unless the stack's ZeRO-3
    gives frozen weights gradients, `SoftwareStack.fsdp_frozen_grads`), and each adapter's down
    (``x·A``) and up (``(x·A)·B``) GEMMs added. Under tensor parallelism a column-parallel
    matrix's ``A`` is whole on every device and its ``B`` split; a row-parallel one's ``A``
    split (its ``x·A`` a partial sum) and ``B`` whole.

    >>> from costmodel.inputs.model_config import ModelConfig
    >>> m = ModelConfig(name="m", hidden_size=1024, num_layers=2, num_heads=16, ffn_size=4096, vocab_size=1000)
    >>> ks = layer_forward_kernels(m, TrainConfig(seq_len=512, workload="finetune-lora"), Layout())
    >>> [k.name for k in ks if k.name.startswith("lora")][:2], next(k.backward_scale for k in ks if k.name == "qkv")
    (['lora_wq_down', 'lora_wq_up'], 1.0)
    """
    e, t, r, dropout = train.compute_dtype.bytes, layout.tp, train.workload.adapter_rank, train.workload.adapter_dropout
    tokens = layout.micro_batch * train.seq_len / layout.cp
    adapters = []
    for a in train.workload.adapters(model):
        d_in, d_out = (a.d_in, a.d_out / t) if a.split == "column" else (a.d_in / t, a.d_out)
        adapters += [_matmul(f"lora_{a.name}_down", tokens, r, d_in, elem_bytes=e),
                     _matmul(f"lora_{a.name}_up", tokens, d_out, r, elem_bytes=e),
                     *(adapter_elementwise_kernels(a.name, tokens * d_in, tokens * d_out, dropout=dropout, elem_bytes=e)
                       if layout.stack.eager_adapters else ())]
    trained = train.workload.trains_base_weights or (layout.zero_stage >= 3 and layout.stack.fsdp_frozen_grads)
    return (kernels if trained else [_frozen(k) for k in kernels]) + adapters


# HBM passes of an adapter's eager elementwise ops, as NeMo's ParallelLinearAdapter.forward
# (NVIDIA/NeMo @b2eccd2, v2.0.0.rc0.beta, nemo/collections/nlp/modules/common/megatron/adapters/
# parallel_adapters.py, and mcore_mixins.py's `mixed_qkv + lora_mixed_qkv`, `output + lora_output`)
# and Hugging Face PEFT's `result + lora_B(lora_A(dropout(x))) * scaling` run them:
# dropout writes the dropped input and a one-byte mask (2.5 passes), its backward reads the
# gradient and the mask (2.5); the alpha/r scale reads and writes the adapter output, both ways (2, 2);
# the add into the frozen GEMM's output reads two tensors and writes one (3), and has no backward
# of its own, but the adapter's input also feeds the frozen GEMM, so autograd sums the two
# input gradients (3 passes over the input).
_ADAPTER_DROPOUT_PASSES = (2.5, 2.5)
_ADAPTER_SCALE_PASSES = (2.0, 2.0)
_ADAPTER_ADD_PASSES = 3.0
_ADAPTER_INPUT_GRAD_SUM_PASSES = 3.0


def adapter_elementwise_kernels(name: str, in_elements: float, out_elements: float, *, dropout: float, elem_bytes: int) -> list[Kernel]:
    """One adapter's memory-bound kernels beside its two GEMMs: the dropout on its input
    (only where ``dropout`` > 0), the alpha/r scale of its output, and the add into the frozen
    output (forward) with the sum of the two input gradients (backward).

    >>> [(k.name, k.bytes, k.backward_scale) for k in adapter_elementwise_kernels("wo", 100, 10, dropout=0.1, elem_bytes=2)]
    [('lora_wo_dropout', 500.0, 1.0), ('lora_wo_scale', 40.0, 1.0), ('lora_wo_add', 60.0, 10.0)]
    """
    kernels = [_memory(f"lora_{name}_dropout", in_elements, _ADAPTER_DROPOUT_PASSES, elem_bytes=elem_bytes)] if dropout > 0 else []
    add = _memory(f"lora_{name}_add", out_elements, (_ADAPTER_ADD_PASSES, _ADAPTER_ADD_PASSES), elem_bytes=elem_bytes)
    grad_sum_bytes = in_elements * _ADAPTER_INPUT_GRAD_SUM_PASSES * elem_bytes
    return kernels + [_memory(f"lora_{name}_scale", out_elements, _ADAPTER_SCALE_PASSES, elem_bytes=elem_bytes),
                      add.model_copy(update={"backward_scale": grad_sum_bytes / add.bytes})]


def _attention_core(model: ModelConfig, train: TrainConfig, layout: Layout) -> list[Kernel]:
    e = train.compute_dtype.bytes
    heads = model.num_heads / layout.tp
    s_q = train.seq_len / layout.cp
    s_kv = train.seq_len  # context parallel: each query chunk still meets every key
    b, d = layout.micro_batch, model.head_dim
    if layout.stack.attention is Attention.FLASH:
        # Causal flash kernels skip blocks above the diagonal: half the score work; under a sliding
        # window also the blocks before it (FlashAttention-2's window_size), s·w − w²/2 pairs; over
        # packed documents those of other documents (the varlen kernels), L²/2 pairs per document.
        flops = 4 * b * heads * d * train.attention_pairs(model) / layout.cp
        kv_heads = model.num_kv_heads / layout.tp
        io_bytes = e * b * s_q * d * (2 * heads) + e * b * s_kv * d * 2 * kv_heads
        keys = min(train.document_len or train.seq_len, model.sliding_window or train.seq_len)
        return [Kernel(name="flash_attention", kind=KernelKind.FLASH_ATTENTION, flops=flops, bytes=io_bytes, in_attention_core=True,
                       backward_scale=FLASH_BACKWARD_FLOPS_RATIO, attention_keys=keys)]
    # A materialized score matrix is masked to the causal (or sliding-window) pattern, not shrunk: every score is computed.
    scores = b * heads * s_q * s_kv
    passes = _passes("softmax_dropout" if uses_dropout(model, layout) else "softmax", layout)
    return [
        _matmul("scores", s_q, s_kv, d, elem_bytes=e, batch=b * heads, core=True, cotangent_fused=True),
        _memory("softmax_dropout", scores, passes, elem_bytes=e, core=True),
        _matmul("attn_v", s_q, d, s_kv, elem_bytes=e, batch=b * heads, core=True),
    ]


def _mlp(model: ModelConfig, tokens: float, layout: Layout, *, train: TrainConfig) -> list[Kernel]:
    h, t, elem_bytes = model.hidden_size, layout.tp, train.compute_dtype.bytes
    n_in = 2 if model.mlp.gated else 1
    act_passes = _passes(model.mlp, layout)
    if not model.is_moe:
        f = model.ffn_size / t
        return [
            *_linear("mlp_in", tokens, n_in * f, h, train=train, cotangent_fused=True),
            _memory("mlp_activation", tokens * f, act_passes, elem_bytes=elem_bytes),
            *_linear("mlp_out", tokens, h, f, train=train),
        ]
    # Each token visits top-k experts (with a capacity, every expert fills its buffer, idle
    # slots too); expert weights are split over tp like a dense MLP.
    routed = tokens * mlp_rows_per_token(model, train, layout)
    f = model.moe_ffn_size / t
    kernels = [
        _matmul("router", tokens, model.num_experts, h, elem_bytes=elem_bytes),
        _memory("dispatch", routed * h, _passes("dispatch", layout), elem_bytes=elem_bytes),
        *_linear("expert_in", routed, n_in * f, h, train=train, cotangent_fused=True),
        _memory("expert_activation", routed * f, act_passes, elem_bytes=elem_bytes),
        *_linear("expert_out", routed, h, f, train=train),
        _memory("combine", routed * h, _passes("dispatch", layout), elem_bytes=elem_bytes),
    ]
    if model.shared_expert_ffn_size:
        fs = model.shared_expert_ffn_size / t
        kernels += [
            *_linear("shared_in", tokens, n_in * fs, h, train=train, cotangent_fused=True),
            _memory("shared_activation", tokens * fs, act_passes, elem_bytes=elem_bytes),
            *_linear("shared_out", tokens, h, fs, train=train),
        ]
    return kernels


def head_forward_kernels(model: ModelConfig, train: TrainConfig, layout: Layout) -> list[Kernel]:
    """Final norm, vocabulary projection and cross-entropy (fp32 logits) over the padded
    vocabulary, split over tp where tp divides it (`ModelConfig.vocab_shards`); in pieces
    (``SoftwareStack.cross_entropy_chunks``) the projection and the loss run again in backward."""
    e = train.compute_dtype.bytes
    tokens = layout.micro_batch * train.seq_len / layout.cp
    v = model.vocab_per_shard(layout.tp)
    head = _matmul("lm_head", tokens, v, model.hidden_size, elem_bytes=e, cotangent_fused=True)
    loss = "cross_entropy" if layout.stack.fused_cross_entropy else "vocab_parallel_cross_entropy"
    head, cross_entropy = head if train.workload.trains_base_weights else _frozen(head), \
        _memory("cross_entropy", tokens * v, _passes(loss, layout), elem_bytes=4)
    if layout.stack.cross_entropy_chunks > 1:  # the backward forms each piece's logits again
        head, cross_entropy = (k.model_copy(update={"backward_scale": k.backward_scale + 1}) for k in (head, cross_entropy))
    kernels = [_memory("final_norm", tokens * model.hidden_size, _passes(model.norm, layout), elem_bytes=e), head, cross_entropy]
    if holds_master_weights(model, train, layout):  # the head's weight cast, as `weight_cast_kernel`
        held = v * model.hidden_size / (layout.zero_shards if layout.zero_stage == 3 else 1)
        kernels.append(Kernel(name="head_weight_cast", kind=KernelKind.MEMORY, flops=0, bytes=held * (4 + e), backward_scale=0.0))
    return kernels


def embedding_forward_kernels(model: ModelConfig, train: TrainConfig, layout: Layout) -> list[Kernel]:
    """Token (and position) embedding lookup: a gather writing the residual stream."""
    e = train.compute_dtype.bytes
    tokens = layout.micro_batch * train.seq_len / layout.cp
    lookup = _memory("embedding", tokens * model.hidden_size, _passes("embedding", layout), elem_bytes=e)
    # A frozen table needs no gradient: nothing of the lookup runs backward.
    return [lookup if train.workload.trains_base_weights else lookup.model_copy(update={"backward_scale": 0.0})]
