"""``--workload`` and the flags of LoRA and of serving, shared by ``plan``, ``plan simulate`` and ``plan inspect``.

>>> parser = argparse.ArgumentParser()
>>> add_workload_arguments(parser)
>>> workload_from_args(parser.parse_args(["--workload", "finetune-lora", "--lora-targets", "attn,mlp"]))["lora"].target_label
'attn,mlp'
>>> workload_from_args(parser.parse_args(["--workload", "finetune-lora", "--lora-targets", "q,v"]))["lora"].targets
(<LoraTarget.Q: 'q'>, <LoraTarget.V: 'v'>)
>>> args = parser.parse_args(["--workload", "decode", "--batch", "64", "--context-len", "4096", "--max-token-latency-ms", "20"])
>>> workload_from_args(args)["inference"].max_token_latency_ms, serving_sizes(args)
(20.0, {'global_batch': 64, 'seq_len': 4096})
"""

from __future__ import annotations

import argparse
from typing import Any

from costmodel.errors import InvalidConfigError
from costmodel.inputs.serving_stack import SERVING_STACKS
from costmodel.inputs.workload import (
    FrozenDtype,
    InferenceConfig,
    KvCacheDtype,
    LoraConfig,
    LoraTarget,
    WeightKernel,
    WorkloadKind,
    parse_lora_targets,
)
from costmodel.workloads import workload_type
from planner.cli.commands.arg_types import positive_float, positive_int

_LORA_FLAGS = ("lora_rank", "lora_targets")
_SERVING_FLAGS = ("batch", "context_len", "prompt_len", "max_token_latency_ms", "kv_block_size", "kv_cache_dtype", "serving_stack",
                  "weight_kernel", "weight_group_size")


def lora_targets(text: str) -> tuple[LoraTarget, ...]:
    """``q,v``, ``attn`` or ``attn,mlp`` (any order; `costmodel.inputs.workload.parse_lora_targets`) as matrices."""
    try:
        return parse_lora_targets(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{err}; fix: name matrices or groups, e.g. --lora-targets q,v") from None


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", choices=[w.value for w in WorkloadKind], default=WorkloadKind.PRETRAIN.value,
                        help="pretrain (default), finetune-full (the same step: every weight trains), finetune-lora "
                             "(frozen base, trained low-rank adapters), or serving: prefill (whole prompts) or decode "
                             "(one token per sequence per step, against a KV cache)")
    parser.add_argument("--lora-rank", type=positive_int, help="LoRA adapter rank (default 16; finetune-lora only)")
    parser.add_argument("--lora-targets", type=lora_targets,
                        help="matrices with adapters, comma-separated: q, k, v, o, gate, up, down, or the groups attn (q,k,v,o; "
                             "the default) and mlp (gate,up,down), e.g. q,v or attn,mlp (finetune-lora only)")
    parser.add_argument("--frozen-dtype", choices=[d.value for d in FrozenDtype],
                        help="storage of the frozen base weight matrices: bf16 (default), int8 / int4 weight-only "
                             "(scales not counted), nf4 / nf4-dq as bitsandbytes stores QLoRA's (block-64 fp32 scales; "
                             "dq: 8-bit scales), or fp8 as NeMo's fp8_params (finetune-lora with --precision fp8); "
                             "for prefill and decode, the layer weights' storage (bf16; int8, int4 weight-only; fp8 "
                             "with the GEMMs in fp8, W8A8, on parts with an fp8 peak)")
    parser.add_argument("--document-len", type=positive_int,
                        help="sequence packing (training workloads): each sequence packs documents of this many tokens "
                             "(a mean), attention masked to each document, as FlashAttention's varlen kernels run it")
    parser.add_argument("--batch", type=positive_int, help="sequences each replica serves together (prefill and decode; "
                                                           "default 1); data parallelism adds replicas")
    parser.add_argument("--context-len", type=positive_int, help="tokens in each sequence's KV cache at the predicted decode step "
                                                                 "(prefill and decode; default as --seq-len)")
    parser.add_argument("--prompt-len", type=positive_int, help="prompt tokens prefilled per sequence (default the whole context)")
    parser.add_argument("--max-token-latency-ms", type=positive_float,
                        help="decode: the most milliseconds per output token; the planner takes the most tokens/s within it")
    parser.add_argument("--kv-cache-dtype", choices=[d.value for d in KvCacheDtype],
                        help="KV cache storage (prefill and decode): auto (the compute dtype, default) or fp8 (one byte)")
    parser.add_argument("--kv-block-size", type=positive_int, help="tokens per block of the paged KV-cache allocator (default 16)")
    parser.add_argument("--weight-kernel", choices=[k.value for k in WeightKernel],
                        help="the GEMM kernel int4 weights run (prefill and decode, with --frozen-dtype int4): fused "
                             "(default: dequantized inside the GEMM, each weight read once), autogptq-cuda-old or exllama "
                             "(GPTQ's kernels as AutoGPTQ runs them: per-row dequantization below a row threshold, a 16-bit "
                             "copy above it; docs/workloads.md#serving-stacks)")
    parser.add_argument("--weight-group-size", type=positive_int,
                        help="weights per int4 quantization group, each with a scale and a zero (default 128; read with the "
                             "weights where the serving stack states their layout: torch-compile's tinygemm)")
    parser.add_argument("--serving-stack", choices=list(SERVING_STACKS),
                        help="the software serving the model (prefill and decode): jax (default), vllm, torch-compile, "
                             "tensorrt-llm, tensorrt-llm-0.6 (compiled steps) or hf-eager (Hugging Face generate(), each operator "
                             "dispatched from Python: a step takes at least that host time; docs/workloads.md#serving-stacks)")


def workload_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """``{"workload": ..., "lora": LoraConfig | None, "inference": InferenceConfig | None}`` (and
    ``document_len`` where given) for `planner.config.train_config`; a flag given with a workload it
    does not apply to is refused in one line."""
    lora_given = {f: getattr(args, f) for f in _LORA_FLAGS if getattr(args, f) is not None}
    serving_given = {f: getattr(args, f) for f in _SERVING_FLAGS if getattr(args, f) is not None}
    workload = WorkloadKind(args.workload)
    kind = workload_type(workload)
    _refuse(lora_given, workload, wanted="finetune-lora", applies=kind.takes_adapter_settings)
    _refuse(serving_given, workload, wanted="decode (or prefill)", applies=not kind.runs_backward)
    if args.document_len is not None and not kind.runs_backward:
        raise InvalidConfigError(f"--document-len packs training sequences, not {workload.value} requests",
                                 fix="drop --document-len (or train: --workload pretrain, finetune-full or finetune-lora)")
    packing = {"document_len": args.document_len} if args.document_len is not None else {}
    if not kind.runs_backward and not kind.latency_bounded and "max_token_latency_ms" in serving_given:
        raise InvalidConfigError(f"--max-token-latency-ms bounds decode steps, not {workload.value}",
                                 fix="use --workload decode or drop the flag")
    if args.frozen_dtype is not None and kind.trains_base_weights:
        raise InvalidConfigError(f"--frozen-dtype applies to finetune-lora, prefill and decode, not {args.workload}",
                                 fix="add --workload finetune-lora (or decode) or drop the flag")
    if kind.takes_adapter_settings:
        settings = {"rank": lora_given.get("lora_rank"), "targets": lora_given.get("lora_targets"), "frozen_dtype": args.frozen_dtype}
        return {"workload": args.workload, "lora": LoraConfig(**{k: v for k, v in settings.items() if v is not None}), "inference": None,
                **packing}
    if not kind.runs_backward:
        settings = {"prompt_len": args.prompt_len, "kv_block_size": args.kv_block_size,
                    "max_token_latency_ms": args.max_token_latency_ms, "weight_dtype": args.frozen_dtype,
                    "kv_cache_dtype": args.kv_cache_dtype, "serving_stack": args.serving_stack, "weight_kernel": args.weight_kernel,
                    "weight_group_size": args.weight_group_size}
        return {"workload": args.workload, "lora": None,
                "inference": InferenceConfig(**{k: v for k, v in settings.items() if v is not None})}
    return {"workload": args.workload, "lora": None, "inference": None, **packing}


def serving_sizes(args: argparse.Namespace) -> dict[str, int]:
    """A serving workload's batch and context as `TrainConfig`'s ``global_batch`` and ``seq_len``
    (``--batch`` default 1, ``--context-len`` default ``--seq-len``); nothing for training."""
    if workload_type(args.workload).runs_backward:
        return {}
    sizes = {"global_batch": args.batch or 1}
    context = args.context_len or getattr(args, "seq_len", None)
    return sizes | ({"seq_len": context} if context else {})


def _refuse(given: dict[str, Any], workload: WorkloadKind, *, wanted: str, applies: bool) -> None:
    if given and not applies:
        flag = next(iter(given)).replace("_", "-")
        raise InvalidConfigError(f"--{flag} applies to --workload {wanted}, not {workload.value}",
                                 fix=f"add --workload {wanted.split()[0]} or drop the flag")
