"""``plan largest --devices 8 --hardware h100-sxm``: the largest model of a family that trains there."""

from __future__ import annotations

import argparse
import json

from planner.cli.commands.arg_types import add_memory_reserve_argument, positive_float, positive_int
from planner.largest import FAMILIES, largest_model

_GIB = 2**30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--devices", type=positive_int, required=True, help="device count")
    parser.add_argument("--hardware", default="h100-sxm", help="hardware profile name or JSON path (default h100-sxm)")
    add_memory_reserve_argument(parser)
    parser.add_argument("--family", choices=sorted(FAMILIES), default="llama", help="model family to scale (default llama)")
    parser.add_argument("--seq-len", type=positive_int, help="tokens per sequence (default 2048, or the family's learned positions)")
    parser.add_argument("--global-batch", type=positive_int, help="sequences per step (default one per device)")
    parser.add_argument("--search-time-limit-s", type=positive_float, default=5.0,
                        help="limit of each size's layout search (default 5); --time-limit-s bounds the whole command")
    parser.add_argument("--json", action="store_true", help="print params, model, layout, bound, the next larger shape as JSON "
                             "(the model loads with plan simulate --model FILE)")


def run(args: argparse.Namespace) -> int:
    r = largest_model(devices=args.devices, hardware=args.hardware, family=args.family, seq_len=args.seq_len,
                      global_batch=args.global_batch, time_limit_s=args.search_time_limit_s,
                      memory_reserve_gib=args.memory_reserve_gib)
    lay, mem = r.predicted.layout, r.predicted.memory
    if args.json:
        print(json.dumps({"params": r.params, "model": r.model.model_dump(mode="json"), "layout": lay.model_dump(mode="json"),
                          "bound": r.bound, "next_params": r.next_params, "memory": mem.model_dump(mode="json"),
                          "next_model": r.next_model.model_dump(mode="json") if r.next_model else None,
                          "step_time_s": r.predicted.step_time_s, "probes": r.probes}))
        return 0
    m = r.model
    state = (mem.params_bytes + mem.grads_bytes + mem.optimizer_bytes) / _GIB
    print(f"largest {args.family} on {args.devices}× {args.hardware}: {r.params / 1e9:.2f} B parameters "
          f"(hidden {m.hidden_size}, {m.num_layers} layers, {m.num_heads} heads, {m.num_kv_heads} key/value heads, MLP {m.ffn_size})")
    print(f"layout: {lay.degrees_text} · micro-batch {lay.micro_batch} · {lay.recompute} recompute · "
          f"ZeRO {lay.zero_stage} · step {r.predicted.step_time_s:.3f} s")
    print(f"bound by {r.bound}: params+grads+optimizer {state:.1f} GiB, activations+temporary "
          f"{(mem.activations_bytes + mem.temporary_bytes) / _GIB:.1f} GiB, within {mem.limit_text()} per device"
          + (f"; the next size ({r.next_params / 1e9:.2f} B, hidden {r.next_model.hidden_size}, {r.next_model.num_layers} layers) "
             "fits no layout" if r.next_model else ""))
    return 0
