"""``plan budget --devices 1024 --hardware h100-sxm --days 30``: the compute-optimal model and its token count."""

from __future__ import annotations

import argparse
import json

from planner.budget import MFU_GUESS, compute_optimal_model
from planner.cli.commands.arg_types import add_memory_reserve_argument, positive_float, positive_int
from planner.largest import FAMILIES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--devices", type=positive_int, required=True, help="device count")
    parser.add_argument("--hardware", default="h100-sxm", help="hardware profile name or JSON path (default h100-sxm)")
    add_memory_reserve_argument(parser)
    parser.add_argument("--days", type=positive_float, required=True, help="days of training steps the budget buys, e.g. 30")
    parser.add_argument("--family", choices=sorted(FAMILIES), default="llama", help="model family to scale (default llama)")
    parser.add_argument("--seq-len", type=positive_int, help="tokens per sequence (default 2048, or the family's learned positions)")
    parser.add_argument("--global-batch", type=positive_int,
                        help="sequences per step, the same for every size tried (default: DeepSeek LLM's batch rule at the "
                             f"budget's compute, devices × peak × {100 * MFU_GUESS:.0f} %% MFU × days; the batch line says why)")
    parser.add_argument("--search-time-limit-s", type=positive_float, default=5.0,
                        help="limit of each size's layout search (default 5); --time-limit-s bounds the whole command")
    parser.add_argument("--json", action="store_true", help="print params, tokens, model, layout, predicted, rule as JSON")


def run(args: argparse.Namespace) -> int:

    r = compute_optimal_model(devices=args.devices, hardware=args.hardware, days=args.days, family=args.family,
                              seq_len=args.seq_len, global_batch=args.global_batch, time_limit_s=args.search_time_limit_s,
                              memory_reserve_gib=args.memory_reserve_gib)
    est, lay = r.plan.predicted, r.plan.layout
    if args.json:
        print(json.dumps({"params": r.params, "tokens": r.tokens, "rule": r.rule, "tokens_per_param": r.tokens_per_param,
                          "days": r.days, "compute_flops": r.compute_flops, "delivered_tokens": r.delivered_tokens,
                          "delivered_flops": r.delivered_flops, "batch": r.batch.model_dump(mode="json"),
                          "model": r.model.model_dump(mode="json"),
                          "layout": lay.model_dump(mode="json"), "mesh": [a.model_dump(mode="json") for a in r.plan.mesh],
                          "predicted": est.model_dump(mode="json"), "probes": [p.model_dump(mode="json") for p in r.probes]}))
        return 0
    m = r.model
    print(f"compute-optimal {args.family} for {args.days:g} days on {args.devices}× {args.hardware}: {r.params / 1e9:.2f} B "
          f"parameters (hidden {m.hidden_size}, {m.num_layers} layers, {m.num_heads} heads, MLP {m.ffn_size}) on "
          f"{r.tokens / 1e12:.3g} T tokens")
    print(f"rule: {r.rule}; D/N = {r.tokens / r.params:g}; 6·N·D = {r.compute_flops:.3e} FLOPs")
    print(f"delivered: {est.tokens_per_s:,.0f} tokens/s × {args.days:g} days = {r.delivered_tokens / 1e12:.3g} T tokens, "
          f"6·N × that = {r.delivered_flops:.3e} FLOPs ({100 * (r.compute_flops / r.delivered_flops - 1):+.1f} % from the rule's)")
    print(f"plan: {lay.degrees_text} · micro-batch {lay.micro_batch} · {lay.recompute} recompute · ZeRO "
          f"{lay.zero_stage} · step {est.step_time_s:.3f} s · MFU {est.mfu:.1%}   ({len(r.probes)} sizes planned)")
    print(f"batch: {r.batch.sequences:,} × {r.plan.train.seq_len} = {r.batch.tokens / 1e6:,.3g} M tokens for every size   "
          f"({r.batch.reason})")
    return 0
