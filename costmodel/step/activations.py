"""Activation memory of one transformer layer for one micro-batch, term by term.

Follows Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models", section 4): with s tokens per device (seq_len / cp), b micro-batch, h width,
a heads and t tensor-parallel degree, a GPT layer with materialized attention and
dropout keeps

    s·b·h·(10 + 24/t + 5·a·s/(h·t)) bytes   (tensor parallel)
    s·b·h·(34/t + 5·a·s/(h·t))              (tensor + sequence parallel)
    s·b·h·34/t                              (+ selective recompute)
    2·s·b·h (/t with SP)                    (full recompute: the layer input only)

The 5·a·s/(h·t) term is the materialized S×S matrices: softmax output and dropout
output (16-bit) and dropout mask (one byte). Flash attention never stores them; it keeps
its output (already among the 34) and an fp32 log-sum-exp per query and head, so without
recompute it holds s·b·h·(10 + 24/t) + 4·a·s·b/t bytes (s·b·h·34/t + 4·a·s·b/t with SP).
Selective recompute drops the s² terms, leaving both kernels alike; full recompute keeps
the layer input only, whatever the kernel.

Each stored tensor is a row of a table (`activation_table`), so the same rules extend to
GQA (smaller K/V), gated MLPs of any width, models without dropout and mixture-of-experts.

LoRA fine-tuning (`costmodel.inputs.workload`) keeps what the backward through frozen layers needs
(`lora_activation_terms`): the input gradient of a frozen matmul needs only its weight, so
a matmul input kept only for its weight gradient is dropped unless an adapter reads the same
input (the adapter's ``A`` gradient needs it); norms, attention and activation functions keep
their inputs as before; each adapter keeps its ``x·A`` (``r`` wide) for ``B``'s gradient.
Over NF4 frozen weights on a stack whose bitsandbytes keeps every 4-bit linear's input
(`SoftwareStack.bnb_4bit_saves_input`), no matmul input is dropped.

>>> from costmodel.inputs.model_config import ModelConfig
>>> from costmodel.inputs.stack import stack_with
>>> gpt = ModelConfig(name="g", hidden_size=12288, num_layers=96, num_heads=96, ffn_size=4 * 12288,
...                   vocab_size=51200, norm="layernorm", mlp="gelu", positions="learned")
>>> lay = Layout(tp=8, stack=stack_with("jax", attention="materialized", dropout=True))
>>> s, b, h, a, t = 2048, 1, 12288, 96, 8
>>> activation_bytes_per_layer(gpt, TrainConfig(seq_len=s), lay) == s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
True
>>> flash = Layout(tp=8, stack=stack_with("jax", attention="flash", dropout=True))
>>> activation_bytes_per_layer(gpt, TrainConfig(seq_len=s), flash) == s * b * h * (10 + 24 / t) + 4 * a * s * b / t
True
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat

from costmodel.inputs.layout import Layout, Recompute
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import Attention
from costmodel.inputs.train_config import TrainConfig
from costmodel.inputs.workload import LoraGroup, LoraTarget
from costmodel.step.kernels import local_widths, mlp_rows_per_token, uses_dropout


class Role(StrEnum):
    """What a stored tensor is, which decides which recompute policies keep it."""

    INPUT = "input"  # a matmul's or norm's input on the residual stream
    MATMUL_OUTPUT = "matmul_output"  # produced by a GEMM (kept by per-op checkpointing)
    ELEMENTWISE = "elementwise"  # produced by an elementwise op (recomputed by per-op checkpointing)
    ATTENTION_CORE = "attention_core"  # the s² scores/softmax/dropout (dropped by selective recompute)
    ATTENTION_OUTPUT = "attention_output"  # fused attention's output and log-sum-exp


class ActivationTerm(BaseModel):
    """One tensor a layer keeps for its backward pass."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="What the tensor is.")
    bytes: NonNegativeFloat = Field(description="Bytes on one device for one micro-batch.")
    role: Role = Field(description="Decides which recompute policies keep it.")


def activation_table(model: ModelConfig, train: TrainConfig, layout: Layout) -> list[ActivationTerm]:
    """Every tensor one layer keeps for backward with no recompute, on one device."""
    e = train.compute_dtype.bytes
    t = layout.tp
    h = model.hidden_size
    sb, q, kv = local_widths(model, train, layout)
    # Residual-stream tensors are split over tp only with sequence parallelism.
    residual = sb * h * e / (t if layout.sequence_parallel else 1)
    mask = residual / e  # dropout masks are one byte per element
    dropout = uses_dropout(model, layout)
    terms = [
        ActivationTerm(name="attn_norm_input", bytes=residual, role=Role.INPUT),
        ActivationTerm(name="qkv_input", bytes=residual, role=Role.INPUT),
        *_attention_inputs(model, layout, sb=sb, q=q, kv=kv, e=e),
        *_attention_core(model, train, layout, dropout=dropout),
        ActivationTerm(name="attn_out_proj_input", bytes=sb * q * e, role=Role.ATTENTION_OUTPUT),
        ActivationTerm(name="mlp_norm_input", bytes=residual, role=Role.INPUT),
        ActivationTerm(name="mlp_input", bytes=residual, role=Role.INPUT),
        *_mlp(model, sb, t, e, eager=not layout.stack.fused_elementwise, rows_per_token=mlp_rows_per_token(model, train, layout)),
    ]
    if dropout:
        terms += [ActivationTerm(name="attn_dropout_mask", bytes=mask, role=Role.ELEMENTWISE),
                  ActivationTerm(name="mlp_dropout_mask", bytes=mask, role=Role.ELEMENTWISE)]
    # Under LoRA a frozen fp8 GEMM keeps nothing for a weight gradient: the inputs kept are the
    # adapters', which run in the compute dtype and keep it.
    if train.workload.trains_base_weights:
        return fp8_activation_terms(terms, train) if train.is_fp8 and layout.stack.fp8_kept_casts else terms
    return lora_activation_terms(terms, model, train, layout)


# The inputs of the fp8 GEMMs: what their weight gradients read in backward.
FP8_SAVED_INPUTS = frozenset({"qkv_input", "attn_out_proj_input", "mlp_input", "mlp_down_input", "expert_inputs"})


def fp8_activation_terms(terms: list[ActivationTerm], train: TrainConfig) -> list[ActivationTerm]:
    """``terms`` as Transformer Engine keeps them under the fp8 recipe: a linear layer saves its
    input for the weight gradient as the fp8 cast it already made (one byte per element, one
    copy: the transpose when its fused cast-transpose wrote one, else the cast), not the 16-bit
    tensor. NVIDIA/TransformerEngine @0004dbd (v1.5), transformer_engine/pytorch/module/linear.py,
    ``_Linear.forward``: ``saved_inputmat_t = inputmat_t`` (or ``saved_inputmat = inputmat``, the
    fp8 cast) in ``ctx.save_for_backward`` unless ``override_linear_precision.wgrad``. Norm
    inputs, q/k/v and the MLP's pre-activation outputs stay 16-bit (the norm, attention and
    activation kernels run in bf16). Only where the stack keeps the casts (`SoftwareStack.fp8_kept_casts`).

    >>> from costmodel.inputs.model_config import ModelConfig
    >>> from costmodel.inputs.stack import stack_with
    >>> from costmodel.inputs.train_config import Precision
    >>> m = ModelConfig(name="m", hidden_size=1024, num_layers=2, num_heads=16, ffn_size=4096, vocab_size=1000)
    >>> bf16, fp8 = TrainConfig(seq_len=512), TrainConfig(seq_len=512).with_precision(Precision.FP8)
    >>> te = Layout(stack=stack_with("megatron-core"))
    >>> {t.name: t.bytes for t in activation_table(m, fp8, te)}["mlp_input"] * 2 == 512 * 1024 * 2
    True
    """
    scale = 1 / train.compute_dtype.bytes
    return [t.model_copy(update={"bytes": t.bytes * scale}) if t.name in FP8_SAVED_INPUTS else t for t in terms]


# Matmul inputs a layer keeps only for weight gradients, with the targets whose adapter ``A``
# gradient would also need them (the attention output also feeds the flash kernel's backward).
_Q, _K, _V, _O = LoraTarget.Q, LoraTarget.K, LoraTarget.V, LoraTarget.O
_MLP = LoraGroup.MLP.targets
_WEIGHT_GRADIENT_INPUTS = {"qkv_input": (_Q, _K, _V), "attn_out_proj_input": (_O,), "mlp_input": (LoraTarget.UP, LoraTarget.GATE),
                           "mlp_down_input": (LoraTarget.DOWN,), "expert_inputs": _MLP, "shared_expert": _MLP}


def lora_activation_terms(terms: list[ActivationTerm], model: ModelConfig, train: TrainConfig,
                          layout: Layout) -> list[ActivationTerm]:
    """``terms`` of a pretraining layer as LoRA fine-tuning keeps them: inputs of frozen
    matmuls without an adapter dropped, each adapter's ``x·A`` added (tokens × r, whole on
    every tensor-parallel device: a row-parallel adapter's is summed over them first).

    >>> from costmodel.inputs.model_config import ModelConfig
    >>> m = ModelConfig(name="m", hidden_size=1024, num_layers=2, num_heads=16, ffn_size=4096, vocab_size=1000)
    >>> names = [t.name for t in activation_table(m, TrainConfig(seq_len=512, workload="finetune-lora"), Layout())]
    >>> "mlp_input" in names, "qkv_input" in names, "lora_wq_down_output" in names
    (False, True, True)
    >>> from costmodel.inputs.stack import stack_with
    >>> qv = TrainConfig(seq_len=512, workload="finetune-lora", lora={"targets": "q,v"})
    >>> names = [t.name for t in activation_table(m, qv, Layout(stack=stack_with("jax", attention="materialized")))]
    >>> "qkv_input" in names, "attn_out_proj_input" in names, "lora_wo_down_output" in names
    (True, False, False)
    """
    flash = layout.stack.attention is Attention.FLASH
    # bitsandbytes' 4-bit matmul keeps the input of every frozen linear (`SoftwareStack.bnb_4bit_saves_input`).
    frozen_keep_inputs = train.workload.frozen_dtype.is_bitsandbytes and layout.stack.bnb_4bit_saves_input
    readers = _adapter_readers(model, train, layout)
    eager_dropout = layout.stack.adapter_dropout_saved and train.workload.adapter_dropout > 0
    kept, dropouts = [], []
    for t in terms:
        read = readers.get(t.name, 0) if t.name in _WEIGHT_GRADIENT_INPUTS else 0
        if eager_dropout and read:  # each adapter's A reads its own dropout's output, kept with its one-byte mask
            dropouts += [ActivationTerm(name=f"lora_{t.name}_dropout_output", bytes=read * t.bytes, role=Role.ELEMENTWISE),
                         ActivationTerm(name=f"lora_{t.name}_dropout_mask", bytes=read * t.bytes / train.compute_dtype.bytes,
                                        role=Role.ELEMENTWISE)]
            read = 0
        if t.name not in _WEIGHT_GRADIENT_INPUTS or read or (flash and t.name == "attn_out_proj_input") or frozen_keep_inputs:
            kept.append(t)
    tokens = layout.micro_batch * train.seq_len / layout.cp
    return kept + dropouts + [ActivationTerm(name=f"lora_{a.name}_down_output", role=Role.MATMUL_OUTPUT,
                                             bytes=tokens * train.workload.adapter_rank * train.compute_dtype.bytes)
                              for a in train.workload.adapters(model)]


# The matmul input each adapted matrix reads (`costmodel.inputs.workload.WEIGHT_NAMES`).
_ADAPTER_INPUTS = {"wq": "qkv_input", "wk": "qkv_input", "wv": "qkv_input", "wqkv": "qkv_input", "wo": "attn_out_proj_input",
                   "w_in": "mlp_input", "w_gate": "mlp_input", "w_out": "mlp_down_input"}


def _adapter_readers(model: ModelConfig, train: TrainConfig, layout: Layout) -> dict[str, int]:
    """How many adapters (each with its own dropout) read each matmul input; adapters on a fused
    qkv projection (`SoftwareStack.fused_qkv_views`) are one module with one dropout."""
    readers: dict[str, int] = {}
    for a in train.workload.adapters(model):
        readers[_ADAPTER_INPUTS[a.name]] = readers.get(_ADAPTER_INPUTS[a.name], 0) + 1
    if layout.stack.fused_qkv_views and "qkv_input" in readers:
        readers["qkv_input"] = 1
    return readers


def _attention_core(model: ModelConfig, train: TrainConfig, layout: Layout, *, dropout: bool) -> list[ActivationTerm]:
    e = train.compute_dtype.bytes
    b, heads = layout.micro_batch, model.num_heads / layout.tp
    s_q, s_kv = train.seq_len / layout.cp, train.seq_len
    if layout.stack.attention is Attention.FLASH:
        return [ActivationTerm(name="softmax_logsumexp", bytes=b * heads * s_q * 4, role=Role.ATTENTION_OUTPUT)]
    scores = b * heads * s_q * s_kv
    terms = [ActivationTerm(name="softmax_output", bytes=scores * e, role=Role.ATTENTION_CORE)]
    if dropout:
        terms += [ActivationTerm(name="softmax_dropout_mask", bytes=scores, role=Role.ATTENTION_CORE),
                  ActivationTerm(name="softmax_dropout_output", bytes=scores * e, role=Role.ATTENTION_CORE)]
    return terms


def _attention_inputs(model: ModelConfig, layout: Layout, *, sb: float, q: float, kv: float, e: int) -> list[ActivationTerm]:
    """q, k and v as attention's backward keeps them; on a stack that takes them as views of one
    fused projection (`SoftwareStack.fused_qkv_views`), what those views keep alive."""
    if not layout.stack.fused_qkv_views:
        return [ActivationTerm(name=n, bytes=sb * w * e, role=Role.MATMUL_OUTPUT) for n, w in (("q", q), ("k", kv), ("v", kv))]
    if model.num_kv_heads == model.num_heads:  # v a view of the fused output; q and k roped copies
        return [ActivationTerm(name="q", bytes=sb * q * e, role=Role.MATMUL_OUTPUT),
                ActivationTerm(name="k", bytes=sb * kv * e, role=Role.MATMUL_OUTPUT),
                ActivationTerm(name="qkv_output", bytes=sb * (q + 2 * kv) * e, role=Role.MATMUL_OUTPUT)]
    # Grouped kv heads: k and v expanded to every query head, then copied by reshape.
    return [ActivationTerm(name=n, bytes=sb * q * e, role=Role.MATMUL_OUTPUT) for n in ("q", "k", "v")]


def _mlp(model: ModelConfig, sb: float, t: int, e: int, *, eager: bool, rows_per_token: float) -> list[ActivationTerm]:
    """What the MLP keeps; an MoE layer's experts keep their buffers' rows (`mlp_rows_per_token`),
    their input whole on every tensor device (Megatron-Core @f2e5db4 MoEAllGatherTokenDispatcher
    gathers the sequence-split tokens, [S*B/TP, H] -> [S*B, H], before the experts' GEMMs)."""
    tokens = sb * rows_per_token
    f = (model.moe_ffn_size if model.is_moe else model.ffn_size) / t
    terms = [ActivationTerm(name="mlp_up_output", bytes=tokens * f * e, role=Role.MATMUL_OUTPUT)]
    if model.mlp.gated:
        terms.append(ActivationTerm(name="mlp_gate_output", bytes=tokens * f * e, role=Role.MATMUL_OUTPUT))
    if model.mlp.gated and eager:  # the activation's output, which the eager multiply keeps
        terms.append(ActivationTerm(name="mlp_activation_output", bytes=tokens * f * e, role=Role.ELEMENTWISE))
    terms.append(ActivationTerm(name="mlp_down_input", bytes=tokens * f * e, role=Role.ELEMENTWISE))
    if model.is_moe:
        terms += [ActivationTerm(name="expert_inputs", bytes=tokens * model.hidden_size * e, role=Role.INPUT),
                  ActivationTerm(name="router_probs", bytes=sb * model.num_experts * 4, role=Role.ELEMENTWISE)]
    if model.shared_expert_ffn_size:
        fs = model.shared_expert_ffn_size / t
        n = 3 if model.mlp.gated else 2
        terms.append(ActivationTerm(name="shared_expert", bytes=n * sb * fs * e, role=Role.MATMUL_OUTPUT))
    return terms


def layer_input_bytes(model: ModelConfig, train: TrainConfig, layout: Layout) -> float:
    """The layer's input, all that full recompute keeps (split over tp with SP)."""
    sb = layout.micro_batch * train.seq_len / layout.cp
    return sb * model.hidden_size * train.compute_dtype.bytes / (layout.tp if layout.sequence_parallel else 1)


def activation_bytes_per_layer(model: ModelConfig, train: TrainConfig, layout: Layout) -> float:
    """Bytes one layer keeps for backward for one micro-batch under ``layout.recompute``."""
    table = activation_table(model, train, layout)
    total = sum(term.bytes for term in table)
    policy = layout.recompute
    if policy is Recompute.NONE:
        return total
    if policy is Recompute.SELECTIVE:
        return total - sum(term.bytes for term in table if term.role is Role.ATTENTION_CORE)
    if policy is Recompute.FULL:
        return layer_input_bytes(model, train, layout)
    if policy is Recompute.SELECTIVE_LAYER:
        return (total + layer_input_bytes(model, train, layout)) / 2
    # Per-op checkpointing keeps attention outputs and every second matmul output.
    kept = sum(term.bytes for term in table if term.role is Role.ATTENTION_OUTPUT)
    kept += sum(term.bytes for term in table if term.role is Role.MATMUL_OUTPUT) / 2
    return kept + layer_input_bytes(model, train, layout)
