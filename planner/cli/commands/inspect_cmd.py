"""``plan inspect``: parameter count, FLOPs per step and graph size of a model, and what each
axis of a device mesh crosses on a cluster (``--mesh 8x4 --hardware dgx-h100``, with or without a model)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from costmodel.errors import InvalidConfigError, UnsupportedError
from costmodel.hardware.mesh import AxisLink, axis_links, parse_mesh
from costmodel.hardware.profile import ClusterSpec
from costmodel.hardware.registry import load_hardware
from costmodel.inputs.layout import check_sequence
from costmodel.inputs.workload import FrozenDtype
from planner.cli.commands.arg_types import positive_int
from planner.cli.commands.workload_args import add_workload_arguments, workload_from_args
from planner.config import default_seq_len, load_model, train_config

if TYPE_CHECKING:
    from planner.inspect import InspectReport


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="preset name (e.g. llama3-8b) or path to a config.json")
    parser.add_argument("--seq-len", type=positive_int,
                        help="tokens per sequence (default 2048, or the model's learned positions if fewer)")
    parser.add_argument("--global-batch", type=positive_int, default=256, help="sequences per step (default 256)")
    add_workload_arguments(parser)
    parser.add_argument("--mesh", help="show what each axis of this device mesh crosses (NVSwitch, NICs, rails) and the "
                                       "bandwidth the model gives it, e.g. 8x4 or data=8,tensor=4")
    parser.add_argument("--hardware", default="h100-sxm",
                        help="profile or cluster preset for --mesh (e.g. dgx-h100, tpu-v5p-pod) or a cluster JSON path (default h100-sxm)")
    parser.add_argument("--devices-per-node", type=positive_int, help="override the profile's devices per node")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    if args.model is None and args.mesh is None:
        raise InvalidConfigError("plan inspect needs --model, --mesh or both",
                                 fix="e.g. --model llama3-8b, or --mesh 8x4 --hardware dgx-h100")
    cluster = links = None
    if args.mesh:
        cluster = load_hardware(args.hardware, devices_per_node=args.devices_per_node)
        links = axis_links(parse_mesh(args.mesh), cluster)
    report = _inspect(args) if args.model else None
    if args.json:
        data = report.model_dump() if report else {}
        if links is not None:
            data["cluster"] = cluster.summary()
            data["mesh_axes"] = {name: link.model_dump() for name, link in links.items()}
        print(json.dumps(data, sort_keys=True))
        return 0
    console = Console()
    if report:
        console.print(_table(report))
    if links is not None:
        console.print(_links_table(links, args.mesh, cluster))
    return 0


def _inspect(args: argparse.Namespace) -> InspectReport:
    # JAX is imported here, not at start-up: the other commands, and a mesh alone, answer without it.
    from planner.inspect import inspect_model

    cfg = load_model(args.model)
    train = train_config(seq_len=args.seq_len or default_seq_len(cfg), global_batch=args.global_batch, **workload_from_args(args))
    check_sequence(cfg, train)
    if train.workload.runs_backward and train.workload.frozen_dtype is FrozenDtype.FP8:  # fp8 storage needs the fp8 recipe
        raise UnsupportedError("plan inspect traces the bf16 program; --frozen-dtype fp8 needs --precision fp8",
                               fix="inspect with --frozen-dtype bf16, or use plan / plan simulate with --precision fp8")
    return inspect_model(cfg, train)


def _links_table(links: dict[str, AxisLink], mesh: str, cluster: ClusterSpec) -> Table:
    table = Table(title=f"mesh {mesh} on {cluster.name}: what each axis crosses", caption=cluster.summary())
    for col in ("axis", "size", "crosses", "GB/s in node", "GB/s across"):
        table.add_column(col)
    for name, link in links.items():
        table.add_row(name, str(link.devices_per_group), link.crosses, _gb_per_s(link.intra_bytes_per_s), _gb_per_s(link.inter_bytes_per_s))
    return table


def _gb_per_s(bytes_per_s: float | None) -> str:
    # What the collective model uses per device and direction (efficiency and spine included).
    return "-" if bytes_per_s is None else f"{bytes_per_s / 1e9:.1f}"


def _table(r: InspectReport) -> Table:
    table = Table(title=f"{r.model}: one {r.workload} step, seq {r.seq_len} × batch {r.global_batch}", show_header=False)
    rows = [
        ("parameters", f"{r.params:,} ({r.params / 1e9:.3f} B)"),
        *([("  trained (LoRA adapters)", f"{r.trainable_params:,} ({r.trainable_params / r.params:.2%})")]
          if r.trainable_params != r.params else []),
        ("  embedding + head", f"{r.embedding_params:,}"),
        ("  per layer × layers", f"{r.params_per_layer:,} × {r.layers}"),
        ("vocabulary (padded)", f"{r.vocab_size:,} ({r.padded_vocab_size:,})"),
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
