"""``plan serve``: the layout that serves a request rate within latency targets, and what users see.

    plan serve --model llama3-8b --devices 1 --rate 2 --input-len 512 --output-len 256 [--slo-ttft-ms 500 --slo-tpot-ms 50]
               [--draft-model llama3-1b --draft-tokens 4 --acceptance-rate 0.7]

Continuous batching is simulated request by request (`costmodel.step.continuous_batching`) on
each tensor-parallel degree and batch limit (`search.serve_capacity`); the option that meets the
targets at the offered rate with the most capacity is printed with its latencies (p50 and p99),
throughput and KV-cache blocks, then the alternatives. With a draft model, the same layout is
simulated with speculative decoding too, and the speed-up is printed with the acceptance rate it
assumes.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from costmodel.errors import InvalidConfigError
from costmodel.hardware.machine import train_machine
from costmodel.hardware.registry import load_hardware
from costmodel.inputs.serving_stack import SERVING_STACKS
from costmodel.inputs.train_config import Precision
from costmodel.inputs.workload import FrozenDtype, InferenceConfig, KvCacheDtype, WeightKernel
from costmodel.step.continuous_batching import LengthDistribution, ServeConfig, ServeResult, simulate_serving
from costmodel.step.speculative import Speculation
from planner.cli.commands.arg_types import non_negative_int, positive_float, positive_int, positive_int_or_none, probability
from planner.config import load_model, train_config
from search.serve_capacity import BATCH_LIMITS, ServeOption, Slo, serve_options

_MS = 1e3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="preset name or config.json path")
    parser.add_argument("--hardware", default="h100-sxm", help="hardware profile name or JSON path (default h100-sxm)")
    parser.add_argument("--devices", type=positive_int, required=True, help="devices serving the model")
    parser.add_argument("--devices-per-node", type=positive_int, help="override the profile's devices per node")
    parser.add_argument("--rate", type=positive_float, required=True, help="requests arriving per second (Poisson)")
    parser.add_argument("--input-len", type=length_distribution, required=True, metavar="N|A-B|FILE",
                        help="prompt tokens: N each, uniform from A to B, or a CSV of tokens,weight rows (a histogram)")
    parser.add_argument("--output-len", type=length_distribution, required=True, metavar="N|A-B|FILE",
                        help="generated tokens, as --input-len")
    parser.add_argument("--slo-ttft-ms", type=positive_float, help="target p99 time to first token, ms")
    parser.add_argument("--slo-tpot-ms", type=positive_float, help="target p99 time per output token, ms")
    parser.add_argument("--tp", type=positive_int, help="tensor-parallel degree (default: the planner chooses)")
    parser.add_argument("--max-batch", type=positive_int,
                        help=f"most requests running at once per replica (default: chosen among {', '.join(map(str, BATCH_LIMITS))} "
                             "under --slo-tpot-ms, else vLLM's 256)")
    parser.add_argument("--prefill-chunk", type=positive_int_or_none, default=2048, metavar="N|none",
                        help="tokens an iteration runs at most, prompt chunks after the decode tokens (vLLM's "
                             "max_num_batched_tokens; default 2048); none: whole prompts in iterations of their own")
    parser.add_argument("--requests", type=positive_int, default=500, help="requests simulated (default 500)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="seed of arrivals and lengths (default 0)")
    parser.add_argument("--arrivals", type=Path, help="a file of arrival times in seconds, one a line, instead of Poisson arrivals")
    parser.add_argument("--precision", choices=[p.value for p in Precision], default="bf16", help="compute dtype (default bf16)")
    parser.add_argument("--kv-cache-dtype", choices=[d.value for d in KvCacheDtype], default="auto",
                        help="KV cache storage: auto (the compute dtype, default) or fp8 (one byte: twice the blocks)")
    parser.add_argument("--frozen-dtype", choices=[d.value for d in FrozenDtype if not d.is_bitsandbytes], default="bf16",
                        help="storage of the layer weights: bf16 (default), int8 / int4 weight-only, or fp8 (W8A8, with --precision fp8)")
    parser.add_argument("--weight-kernel", choices=[k.value for k in WeightKernel], default="fused",
                        help="the GEMM kernel int4 weights run: fused (default), autogptq-cuda-old or exllama "
                             "(docs/workloads.md#serving-stacks)")
    parser.add_argument("--weight-group-size", type=positive_int, default=128,
                        help="weights per int4 quantization group (default 128; read with the weights where the serving stack "
                             "states their layout: torch-compile's tinygemm)")
    parser.add_argument("--serving-stack", choices=list(SERVING_STACKS), default="jax",
                        help="the software serving the model: jax (default), vllm, torch-compile, tensorrt-llm, "
                             "tensorrt-llm-0.6 (compiled steps) or hf-eager (every operator dispatched from Python: each iteration "
                             "takes at least that)")
    parser.add_argument("--draft-model", help="a draft model for speculative decoding (preset or config.json)")
    parser.add_argument("--draft-tokens", type=positive_int, default=4, help="tokens the draft proposes a step (default 4)")
    parser.add_argument("--acceptance-rate", type=probability, default=0.7,
                        help="probability the target accepts each draft token, an assumption (default 0.7)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def length_distribution(text: str) -> LengthDistribution:
    """``N``, ``A-B`` or a histogram file's path, as `LengthDistribution` (argparse ``type=``).

    >>> length_distribution("512").fixed, length_distribution("256-768").high
    (512, 768)
    """
    try:
        if text.isdigit():
            return LengthDistribution(fixed=int(text))
        low, sep, high = text.partition("-")
        if sep and low.isdigit() and high.isdigit():
            return LengthDistribution(low=int(low), high=int(high))
        with open(text, newline="") as f:
            rows = [(int(r[0]), float(r[1])) for r in csv.reader(f) if r and r[0].strip().isdigit()]
        return LengthDistribution(histogram=tuple(rows))
    except (OSError, ValueError) as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a token count, a range or a readable histogram file ({err.__class__.__name__}); "
                                         "fix: give e.g. 512, 256-768, or a CSV of tokens,weight rows") from None


def _arrivals(path: Path | None) -> tuple[float, ...] | None:
    if path is None:
        return None
    try:
        return tuple(float(line) for line in path.read_text().split())
    except (OSError, ValueError) as err:
        raise InvalidConfigError(f"--arrivals {path}: not a readable file of arrival seconds ({err.__class__.__name__})",
                                 fix="give a text file with one arrival time in seconds a line") from None


def run(args: argparse.Namespace) -> int:
    model = load_model(args.model)
    inference = InferenceConfig(serving_stack=args.serving_stack, kv_cache_dtype=args.kv_cache_dtype, weight_dtype=args.frozen_dtype,
                                weight_kernel=args.weight_kernel, weight_group_size=args.weight_group_size)
    train = train_config(workload="decode", inference=inference).with_precision(Precision(args.precision))
    cluster = load_hardware(args.hardware, devices_per_node=args.devices_per_node)
    hw = train_machine(cluster, train)
    speculation = (Speculation(draft=load_model(args.draft_model), draft_tokens=args.draft_tokens, acceptance_rate=args.acceptance_rate)
                   if args.draft_model else None)
    cfg = ServeConfig(rate_per_s=args.rate, input_len=args.input_len, output_len=args.output_len, requests=args.requests, seed=args.seed,
                      prefill_chunk_tokens=args.prefill_chunk, arrivals_s=_arrivals(args.arrivals))
    slo = Slo(ttft_s=args.slo_ttft_ms and args.slo_ttft_ms / _MS, tpot_s=args.slo_tpot_ms and args.slo_tpot_ms / _MS)
    limits = (args.max_batch,) if args.max_batch else BATCH_LIMITS if slo.tpot_s else (cfg.max_batch,)
    options = serve_options(model, train, hw, n_devices=args.devices, cfg=cfg, slo=slo, batch_limits=limits, tp=args.tp)
    best = options[0]
    speculative = None
    if speculation:
        speculative = simulate_serving(model, train, best.layout, hw,
                                       cfg.model_copy(update={"max_batch": best.max_batch, "speculation": speculation}))
    if args.json:
        print(json.dumps({"chosen": _option_json(best), "alternatives": [_option_json(o) for o in options[1:]],
                          "speculative": speculative and _speculation_json(speculation, best.at_rate, speculative)}, sort_keys=True))
        return 0
    console = Console()
    console.print(_chosen_table(model.name, cluster.name, args, best, slo))
    if speculative:
        console.print(_speculation_line(speculation, best.at_rate, speculative), highlight=False)
    if len(options) > 1:
        console.print(_alternatives_table(options))
    return 0


def _option_json(o: ServeOption) -> dict[str, object]:
    return {"tp": o.layout.tp, "replicas": o.layout.dp, "max_batch": o.max_batch, "meets_slo": o.meets_slo,
            "capacity_per_s": o.capacity_per_s, "at_rate": o.at_rate.model_dump()}


def _speculation_json(spec: Speculation, plain: ServeResult, fast: ServeResult) -> dict[str, object]:
    return {"draft_model": spec.draft.name, "draft_tokens": spec.draft_tokens, "acceptance_rate": spec.acceptance_rate,
            "expected_tokens_per_step": spec.expected_tokens, "tpot_speedup_p50": plain.tpot_p50_s / fast.tpot_p50_s,
            "result": fast.model_dump()}


def _speculation_line(spec: Speculation, plain: ServeResult, fast: ServeResult) -> str:
    return (f"speculative decoding with {spec.draft.name} ({spec.draft_tokens} draft tokens a step, acceptance rate "
            f"{spec.acceptance_rate:g} assumed: {spec.expected_tokens:.2f} tokens a step): time per output token p50 "
            f"{fast.tpot_p50_s * _MS:.2f} ms against {plain.tpot_p50_s * _MS:.2f} ms, {plain.tpot_p50_s / fast.tpot_p50_s:.2f}× faster; "
            f"p99 time to first token {fast.ttft_p99_s * _MS:.1f} ms; {fast.kv_blocks} KV blocks a device with the draft's cache")


def _chosen_table(model: str, hardware: str, args: argparse.Namespace, o: ServeOption, slo: Slo) -> Table:
    r, lay = o.at_rate, o.layout
    targets = ", ".join(f"{name} p99 ≤ {v * _MS:g} ms" for name, v in (("TTFT", slo.ttft_s), ("TPOT", slo.tpot_s)) if v) or "none"
    table = Table(title=f"{model} on {args.devices}× {hardware} at {args.rate:g} requests/s: tp{lay.tp} × {lay.dp} replicas, "
                        f"batch ≤ {o.max_batch}", show_header=False)
    rows = [
        ("targets", f"{targets}: {'met' if o.meets_slo else 'NOT met'} at this rate"),
        ("capacity within the targets", f"{o.capacity_per_s:.2f} requests/s"),
        ("time to first token p50 / p99", f"{r.ttft_p50_s * _MS:.1f} / {r.ttft_p99_s * _MS:.1f} ms"),
        ("time per output token p50 / p99", f"{r.tpot_p50_s * _MS:.2f} / {r.tpot_p99_s * _MS:.2f} ms"),
        ("request latency p50", f"{r.latency_p50_s:.2f} s"),
        ("throughput", f"{r.requests_per_s:.2f} requests/s, {r.output_tokens_per_s:,.0f} output tokens/s"),
        ("running batch (mean)", f"{r.mean_batch:.1f} requests"),
        ("KV blocks a device: held / in use mean / max", f"{r.kv_blocks:,} / {r.kv_blocks_mean_in_use:,.0f} / {r.kv_blocks_max_in_use:,}"),
        ("preemptions", str(r.preemptions)),
        ("simulated", f"{r.completed} requests a replica, {r.iterations:,} iterations, seed {args.seed}"
                      f"{'; the queue grows: the rate is beyond this layout' if r.queue_growing else ''}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def _alternatives_table(options: list[ServeOption]) -> Table:
    table = Table(title="alternatives (most capacity first)")
    for column in ("tp", "replicas", "batch ≤", "meets targets", "capacity req/s", "TTFT p99 ms", "TPOT p99 ms"):
        table.add_column(column)
    for o in options[1:]:
        table.add_row(str(o.layout.tp), str(o.layout.dp), str(o.max_batch), "yes" if o.meets_slo else "no", f"{o.capacity_per_s:.2f}",
                      f"{o.at_rate.ttft_p99_s * _MS:.1f}", f"{o.at_rate.tpot_p99_s * _MS:.2f}")
    return table
