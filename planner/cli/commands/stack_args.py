"""``--stack NAME`` and one flag per software fact, shared by ``plan`` and ``plan simulate``.

A preset from `costmodel.inputs.stack.STACKS` sets every fact; each fact's own flag overrides it
(``--stack megatron-core --tp-overlap none``).
"""

from __future__ import annotations

import argparse

from costmodel.inputs.stack import STACKS, Attention, SoftwareStack, TpOverlap, stack_with

# Fact → (flag values, help). yes/no facts are booleans of `SoftwareStack`.
_FACT_FLAGS: dict[str, tuple[list[str], str]] = {
    "attention": ([a.value for a in Attention], "attention kernel"),
    "dp_overlap": (["yes", "no"], "data-parallel reduction and ZeRO/FSDP gathers overlap compute"),
    "tp_overlap": ([o.value for o in TpOverlap], "tensor-parallel collectives hidden behind GEMMs: none, backward (Megatron "
                   "async TP) or gemm (TransformerEngine / XLA collective matmul)"),
    "fused_projections": (["yes", "no"], "q/k/v and the MLP's input/gate are one GEMM each, so tensor parallelism reduces one "
                          "input gradient per block (Megatron-LM; no: the JAX program's one per weight matrix)"),
    "overlap_param_gather": (["yes", "no"], "ZeRO 1-2's gather of updated parameters runs behind the next forward (no: it "
                             "ends the step, as in the JAX program)"),
    "dropout": (["yes", "no"], "LayerNorm (GPT-style) models train with dropout (no: the JAX program has none)"),
    "fused_elementwise": (["yes", "no"], "activations, RoPE and residual adds fused (no: eager PyTorch)"),
    "fused_norm": (["yes", "no"], "each norm one fused kernel (no: eager RMSNorm)"),
    "overlap_p2p": (["yes", "no"], "interleaved pipeline transfers run behind compute (Megatron-Core overlap_p2p_comm)"),
    "per_chunk_grad_reduce": (["yes", "no"], "interleaved pipelines reduce each chunk's gradients once its last backward is "
                              "done, behind the other chunks' backward (Megatron-Core grad_sync_func)"),
    "lockstep_pipeline": (["yes", "no"], "pipeline stages step in lockstep, one forward and backward per tick on every device "
                          "(the jax stack's single-program 1F1B): 2S-1 micro-batches in flight, bubbles computed"),
    "fused_cross_entropy": (["yes", "no"], "one fused softmax-cross-entropy kernel (no: Megatron's op-by-op fp32 one)"),
    "batch_major": (["yes", "no"], "activations [batch, seq, hidden]: sequence-parallel collectives copy their buffers"),
    "reentrant_recompute": (["yes", "no"], "recompute re-runs the layer's whole forward (Megatron-LM checkpointing)"),
    "fsdp_copy_out": (["yes", "no"], "ZeRO-3 copies gathered parameters out of the all-gather buffer (PyTorch FSDP2)"),
    "fused_grad_accumulation": (["yes", "no"], "weight-gradient GEMMs add into the accumulator (Megatron-LM)"),
    "reduce_every_micro_batch": (["yes", "no"], "ZeRO-2 reduce-scatters after every micro-batch (DeepSpeed)"),
    "fp8_kept_casts": (["yes", "no"], "with --precision fp8, GEMM inputs kept in fp8 and weight casts resident (Transformer "
                       "Engine, torchao; no: the JAX program's bf16 inputs, casts redone)"),
    "fp8_param_gather": (["yes", "no"], "with --precision fp8, weights kept and all-gathered in fp8 (Megatron-LM --fp8-param-gather)"),
    "eager_adapters": (["yes", "no"], "LoRA adapters' dropout, scale and add as kernels of their own (NeMo, PEFT; "
                       "no: fused by a compiler)"),
    "fsdp_frozen_grads": (["yes", "no"], "LoRA with ZeRO-3: frozen weights in the adapters' FSDP flat parameters get "
                          "gradients (FSDP1, Lit-GPT)"),
    "unsharded_grad_accumulation": (["yes", "no"], "ZeRO 2-3 accumulates whole gradients until the last micro-batch "
                                    "(FSDP1 no_sync, Lit-GPT)"),
    "adapter_dropout_saved": (["yes", "no"], "LoRA dropout keeps its output and a one-byte mask beside its input "
                              "(eager nn.Dropout, Lit-GPT)"),
    "fused_qkv_views": (["yes", "no"], "attention reads q, k, v as views of one fused projection, whose output stays alive; "
                        "q/k/v adapters share one dropout (Lit-GPT)"),
    "fp32_weights": (["yes", "no"], "weights held in fp32 as the master copy and cast where used, every forward and "
                     "recomputed forward; gradients fp32, split with the optimizer state from ZeRO 1 (the JAX program; no: a "
                     "compute-dtype copy beside the master, written by the update, Megatron-LM)"),
    "bnb_4bit_saves_input": (["yes", "no"], "LoRA over --frozen-dtype nf4/nf4-dq: every 4-bit linear keeps its input for backward "
                             "(bitsandbytes 0.41.0-0.43.1 MatMul4Bit, Lit-GPT's table)"),
}


def stack_help() -> str:
    """One line per preset for ``--help``: its name and the facts it sets apart from the JAX program's.

    >>> "megatron-core: tp_overlap=gemm" in stack_help()
    True
    """
    jax = STACKS["jax"]
    lines = []
    for name, stack in STACKS.items():
        diff = [f"{k}={_show(v)}" for k, v in stack if k not in ("name", "citation") and v != getattr(jax, k)]
        lines.append(f"{name}: {', '.join(diff) or 'the JAX program plan validate lowers'}")
    return "; ".join(lines)


def _show(value: object) -> str:
    return ("yes" if value else "no") if isinstance(value, bool) else "none" if value is None else str(value)


def add_stack_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", choices=list(STACKS), default="jax",
                        help=f"software stack that runs the layout (default jax); presets: {stack_help()}")
    for fact, (values, help_text) in _FACT_FLAGS.items():
        parser.add_argument(f"--{fact.replace('_', '-')}", choices=values, help=f"{help_text} (default: the stack's)")
    parser.add_argument("--moe-capacity-factor", type=_capacity_factor, metavar="F|none",
                        help="MoE experts compute a buffer of F times their even share of the routed tokens, idle slots "
                             "too (the JAX program: 1.25); none: dropless (default: the stack's)")


def _capacity_factor(text: str) -> float | str:
    if text == "none":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number or 'none'; e.g. --moe-capacity-factor 1.25") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not positive; e.g. --moe-capacity-factor 1.25, or none for dropless")
    return value


def stack_from_args(args: argparse.Namespace) -> SoftwareStack:
    """The ``--stack`` preset with every fact flag given applied over it."""
    given = {fact: getattr(args, fact) for fact in _FACT_FLAGS if getattr(args, fact) is not None}
    facts = {k: v == "yes" if v in ("yes", "no") else v for k, v in given.items()}
    if args.moe_capacity_factor is not None:
        facts["moe_capacity_factor"] = None if args.moe_capacity_factor == "none" else args.moe_capacity_factor
    return stack_with(args.stack, **facts)
