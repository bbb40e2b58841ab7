"""``plan hardware``: which dtypes each built-in part accelerates, at what dense peak, and the
``--precision`` recipes that follow (fp8 needs a float8 peak, tf32 a tf32 one, bf16 a bfloat16 one);
and its memory: usable as the driver reports it, the runtime reserve (`costmodel.hardware.reserve`),
and what plans may fill, usable − reserve."""

from __future__ import annotations

import argparse
import json

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.table import Table

from costmodel.hardware.catalog import CATALOG
from costmodel.hardware.machine import supported_precisions
from costmodel.hardware.profile import ClusterSpec
from costmodel.hardware.registry import load_hardware

# Catalog dtype keys, in the order the table shows them.
DTYPE_COLUMNS = ("float32", "tf32", "bfloat16", "float16", "float8_e4m3fn", "int8")
MEMORY_COLUMNS = ("usable", "reserve", "fits")
_GIB = 2**30


class PartSummary(BaseModel):
    """One part's dense peaks, the precisions they allow, and its memory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    part: str = Field(description="Device name, as --hardware takes it.")
    peak_tflops_by_dtype: dict[str, float] = Field(description="Dense peak TFLOP/s (TOPS for int8) per dtype the part has.")
    precisions: list[str] = Field(description="--precision values the part runs (`costmodel.hardware.machine.supported_precisions`).")
    usable_memory_gib: float = Field(description="Device memory a process can address, GiB: the driver's figure where the "
                                                 "profile has it (usable_hbm_bytes), else the datasheet's.")
    memory_reserve_gib: float = Field(description="Runtime reserve, GiB: CUDA context, communication buffers, fragmentation "
                                                  "(the profile's memory_reserve_bytes, else its kind's default).")
    fit_memory_gib: float = Field(description="usable − reserve, GiB: the most a plan's predicted peak may be and still fit.")
    source: str = Field(description="Where the peaks come from.")


def part_summary(cluster: ClusterSpec) -> PartSummary:
    """``cluster``'s part as a row of the table.

    >>> row = part_summary(load_hardware("h100-sxm"))
    >>> row.precisions[-1], round(row.usable_memory_gib, 1), round(row.memory_reserve_gib, 1), round(row.fit_memory_gib, 1)
    ('fp8', 79.6, 4.0, 75.7)
    """
    device = cluster.device
    usable, reserve = device.usable_bytes / _GIB, device.reserve_bytes / _GIB
    return PartSummary(part=device.name, peak_tflops_by_dtype={k: v / 1e12 for k, v in device.peak_flops_per_s.items()},
                       precisions=[p.value for p in supported_precisions(cluster)], usable_memory_gib=usable,
                       memory_reserve_gib=reserve, fit_memory_gib=usable - reserve, source=device.source)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hardware", help="one profile name or cluster JSON path (default: every built-in part)")
    parser.add_argument("--json", action="store_true", help="print one JSON list")


def run(args: argparse.Namespace) -> int:
    clusters = [load_hardware(args.hardware)] if args.hardware else list(CATALOG.values())
    rows = list({r.part: r for r in map(part_summary, clusters)}.values())  # one row per part
    if args.json:
        print(json.dumps([r.model_dump() for r in rows], sort_keys=True))
        return 0
    table = Table(title="Dense peak TFLOP/s per dtype (blank: no peak; the part cannot run that precision). Memory GiB: usable "
                        "as the driver reports it, the runtime reserve, and what a plan fits in (usable − reserve)")
    for column in ("part", *DTYPE_COLUMNS, "--precision", *MEMORY_COLUMNS):
        table.add_column(column, justify="left" if column in ("part", "--precision") else "right")
    for r in rows:
        peaks = [f"{r.peak_tflops_by_dtype[d]:,.1f}" if d in r.peak_tflops_by_dtype else "" for d in DTYPE_COLUMNS]
        memory = (f"{r.usable_memory_gib:.1f}", f"{r.memory_reserve_gib:.1f}", f"{r.fit_memory_gib:.1f}")
        table.add_row(r.part, *peaks, " ".join(r.precisions), *memory)
    Console(width=150).print(table)
    return 0
