"""``plan --format megatron``: Megatron-LM / Megatron-Core command-line arguments of a plan.

Every flag is one ``megatron/training/arguments.py`` defines at the commit in
``planner/cli/export_schemas/megatron.json`` (tested against it).

>>> from planner.api import plan
>>> args = to_megatron(plan("llama3-8b", mesh="data=4,tensor=8", hardware="h100-sxm", global_batch=64, stack="megatron-core"))
>>> args[args.index("--tensor-model-parallel-size") + 1]
'8'
"""

from __future__ import annotations

from costmodel.errors import InvalidConfigError
from costmodel.inputs.layout import Recompute
from costmodel.inputs.model_config import MlpKind, Norm, Positions
from costmodel.inputs.train_config import Precision
from planner.plan_schema import Plan

_NORMS = {Norm.RMSNORM: "RMSNorm", Norm.LAYERNORM: "LayerNorm"}


def _recompute(plan: Plan) -> list[str]:
    """Megatron's recompute flags closest to the plan's policy: selective is Korthikanti et al.'s
    (Megatron's own); torchtitan's per-op policy also keeps the matmuls, so selective too; its
    every-second-layer policy is full recompute of half of each stage's layers (block method)."""
    lay = plan.layout
    per_stage = plan.model.num_layers // (lay.pp * lay.interleave)
    return {
        Recompute.NONE: [],
        Recompute.SELECTIVE: ["--recompute-granularity", "selective"],
        Recompute.SELECTIVE_OP: ["--recompute-granularity", "selective"],
        Recompute.SELECTIVE_LAYER: ["--recompute-granularity", "full", "--recompute-method", "block",
                                    "--recompute-num-layers", str(max(1, per_stage // 2))],
        Recompute.FULL: ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"],
    }[lay.recompute]


def _data_parallel(plan: Plan) -> list[str]:
    """ZeRO 1 and 2 are Megatron's distributed optimizer (optimizer state sharded, gradients
    reduce-scattered); ZeRO 3 is Megatron-FSDP sharding optimizer, gradients and parameters."""
    lay = plan.layout
    if lay.dp == 1 or lay.zero_stage == 0:
        flags = []
    elif lay.zero_stage in (1, 2):
        flags = ["--use-distributed-optimizer"]
    else:
        flags = ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"]
    return flags + (["--optimizer-cpu-offload"] if lay.offload != "none" else [])


def vocab_divisor(plan: Plan) -> int:
    """``--make-vocab-size-divisible-by``: Megatron pads the vocabulary to a multiple of this times
    the tensor-parallel size (``_vocab_size_with_padding``), so this is the model's
    ``vocab_multiple`` over tp where tp divides it (GPT-2 at tp 4: 32, padding 50257 to 50304 as
    the plan's `ModelConfig.padded_vocab_size`), else the largest value up to ``vocab_multiple``
    that pads to the same size. Where tp does not divide that size (the plan keeps the
    vocabulary whole), none does: ``vocab_multiple``, and Megatron pads further than the plan.

    >>> from planner.api import plan
    >>> p = plan("gpt2-medium", mesh="data=2,tensor=4", hardware="a100-40gb", global_batch=32, seq_len=1024)
    >>> vocab_divisor(p), -(-p.model.vocab_size // (vocab_divisor(p) * p.layout.tp)) * vocab_divisor(p) * p.layout.tp
    (32, 50304)
    """
    m, tp = plan.model, plan.layout.tp
    v, padded = m.vocab_size, m.padded_vocab_size
    if m.vocab_multiple % tp == 0:
        return m.vocab_multiple // tp
    if padded % tp:
        return m.vocab_multiple
    return next(k for k in range(min(m.vocab_multiple, padded // tp), 0, -1) if (padded // tp) % k == 0 and padded - k * tp < v)


def _model(plan: Plan) -> list[str]:
    m = plan.model
    flags = ["--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size), "--ffn-hidden-size", str(m.ffn_size),
             "--num-attention-heads", str(m.num_heads), "--kv-channels", str(m.head_dim),
             "--max-position-embeddings", str(m.max_position_embeddings), "--vocab-size", str(m.vocab_size),
             "--make-vocab-size-divisible-by", str(vocab_divisor(plan)),
             "--normalization", _NORMS[m.norm], "--norm-epsilon", repr(m.norm_eps)]
    if m.num_kv_heads != m.num_heads:
        flags += ["--group-query-attention", "--num-query-groups", str(m.num_kv_heads)]
    if m.positions is Positions.ROPE:
        flags += ["--position-embedding-type", "rope", "--rotary-base", str(int(m.rope_theta))]
    else:
        flags += ["--position-embedding-type", "learned_absolute"]
    if m.mlp is MlpKind.SWIGLU:
        flags.append("--swiglu")
    if not m.tie_embeddings:
        flags.append("--untie-embeddings-and-output-weights")
    if not (m.out_bias or m.mlp_bias):
        flags.append("--disable-bias-linear")
    if m.qkv_bias:
        flags.append("--add-qkv-bias")
    if m.num_experts:
        flags += ["--num-experts", str(m.num_experts), "--moe-router-topk", str(m.experts_per_token),
                  "--moe-ffn-hidden-size", str(m.moe_ffn_size)]
    return flags


def to_megatron(plan: Plan) -> list[str]:
    """``pretrain_gpt.py`` arguments: parallelism, batch, recompute, precision and the model's shape.

    Raises:
      InvalidConfigError: uneven pipeline stages (Megatron cuts layers evenly, bar the first and
        last stage's flags this export does not use), or a precision Megatron has no flag for.
    """
    lay, train = plan.layout, plan.train
    if lay.stage_layers:
        raise InvalidConfigError(f"Megatron pipelines cut layers evenly; this plan's stages hold {lay.stage_layers} layers",
                                 fix="use --format json, or plan with a layer count the stages divide")
    flags = ["--tensor-model-parallel-size", str(lay.tp), "--pipeline-model-parallel-size", str(lay.pp),
             "--context-parallel-size", str(lay.cp)]
    if lay.ep > 1:
        flags += ["--expert-model-parallel-size", str(lay.ep)]
    if lay.interleave > 1:
        flags += ["--num-layers-per-virtual-pipeline-stage", str(plan.model.num_layers // (lay.pp * lay.interleave))]
    if lay.sequence_parallel and lay.tp > 1:
        flags.append("--sequence-parallel")
    flags += ["--micro-batch-size", str(lay.micro_batch), "--global-batch-size", str(train.global_batch),
              "--seq-length", str(train.seq_len)]
    precision = {Precision.BF16: ["--bf16"], Precision.FP16: ["--fp16"], Precision.FP8: ["--bf16", "--fp8-format", "hybrid"],
                 Precision.FP32: []}.get(train.precision)
    if precision is None:
        raise InvalidConfigError(f"Megatron has no flag for precision {train.precision}", fix="plan with --precision bf16, fp16 or fp8")
    if not lay.stack.dropout:
        flags += ["--attention-dropout", "0.0", "--hidden-dropout", "0.0"]
    return flags + precision + _recompute(plan) + _data_parallel(plan) + _model(plan)


def megatron_command_line(plan: Plan) -> str:
    """The arguments one flag (and its value) a line, continued for a shell."""
    lines, flags = [], to_megatron(plan)
    for flag in flags:
        if flag.startswith("--") or not lines:
            lines.append(flag)
        else:
            lines[-1] += f" {flag}"
    return " \\\n".join(lines) + "\n"
