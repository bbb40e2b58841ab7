"""``plan inspect``: parameter count, FLOPs per step and graph size of a model."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from costmodel.hardware import load_hardware
from costmodel.layout import check_sequence
from costmodel.mesh import AxisLink, axis_links, parse_mesh
from planner.commands.arg_types import positive_int
from planner.config import default_seq_len, load_model, train_config

if TYPE_CHECKING:
    from planner.inspect import InspectReport


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="preset name (e.g. llama3-8b) or path to a config.json")
    parser.add_argument("--seq-len", type=positive_int,
                        help="tokens per sequence (default 2048, or the model's learned positions if fewer)")
    parser.add_argument("--global-batch", type=positive_int, default=256, help="sequences per step (default 256)")
    parser.add_argument("--mesh", help="also show which links each axis of this device mesh crosses, e.g. 8x4 or data=8,tensor=4")
    parser.add_argument("--hardware", default="h100-sxm", help="hardware profile for --mesh (default h100-sxm)")
    parser.add_argument("--devices-per-node", type=positive_int, help="override the profile's devices per node")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    # JAX is imported here, not at start-up: the other commands answer without it.
    from planner.inspect import inspect_model

    cfg = load_model(args.model)
    train = train_config(seq_len=args.seq_len or default_seq_len(cfg), global_batch=args.global_batch)
    check_sequence(cfg, train)
    links = None
    if args.mesh:
        links = axis_links(parse_mesh(args.mesh), load_hardware(args.hardware, devices_per_node=args.devices_per_node))
    report = inspect_model(cfg, train)
    if args.json:
        data = report.model_dump()
        if links is not None:
            data["mesh_axes"] = {name: link.model_dump() for name, link in links.items()}
        print(json.dumps(data, sort_keys=True))
        return 0
    console = Console()
    console.print(_table(report))
    if links is not None:
        console.print(_links_table(links, args.mesh, args.hardware))
    return 0


def _links_table(links: dict[str, AxisLink], mesh: str, hardware: str) -> Table:
    table = Table(title=f"mesh {mesh} on {hardware}: links each axis crosses")
    for col in ("axis", "devices", "nodes spanned", "links", "bottleneck GB/s", "torus ring"):
        table.add_column(col)
    for name, link in links.items():
        table.add_row(name, str(link.devices_per_group), str(link.nodes_per_group), " + ".join(link.tiers) or "none",
                      f"{link.bottleneck_bytes_per_s / 1e9:.1f}", "yes" if link.wraparound else "no")
    return table


def _table(r: InspectReport) -> Table:
    table = Table(title=f"{r.model}: one training step, seq {r.seq_len} × batch {r.global_batch}", show_header=False)
    rows = [
        ("parameters", f"{r.params:,} ({r.params / 1e9:.3f} B)"),
        ("  embedding + head", f"{r.embedding_params:,}"),
        ("  per layer × layers", f"{r.params_per_layer:,} × {r.layers}"),
        ("FLOPs per step", f"{r.flops_per_step:.4g}"),
        ("  of which matmul", f"{r.matmul_flops_per_step:.4g}"),
        ("FLOPs per token", f"{r.flops_per_token:.4g}"),
        ("bytes accessed per step (unfused)", f"{r.bytes_accessed_per_step:.4g}"),
        ("ops in graph (layer once)", f"{r.ops:,}"),
        ("extraction time", f"{r.extract_time_s:.2f} s"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table
