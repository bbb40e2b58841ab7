"""``plan compare``: the ILP and the search planners on one strategy space, side by side."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from costmodel.errors import InvalidConfigError
from planner.cli.commands.arg_types import positive_float, positive_int
from planner.cli.csv_out import write_csv
from planner.compare import CompareResult, compare, plot_traces


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="preset name or config.json path")
    parser.add_argument("--mesh", required=True, help="device mesh, e.g. 8x4 or data=8,tensor=4")
    parser.add_argument("--hardware", default="h100-sxm", help="hardware profile name or JSON path (default h100-sxm)")
    parser.add_argument("--seq-len", type=positive_int, help="tokens per sequence")
    parser.add_argument("--global-batch", type=positive_int, default=256, help="sequences per step (default 256)")
    parser.add_argument("--planners", default="ilp,grid,anneal,beam,random", help="comma-separated, ilp included (default all)")
    parser.add_argument("--budget-s", type=positive_float, default=30.0, help="wall seconds each planner may run (default 30)")
    parser.add_argument("--seeds", type=positive_int, default=3, help="seeds per search planner (default 3)")
    parser.add_argument("--out-dir", type=Path, help="write compare.csv, traces.csv and compare.png here")
    parser.add_argument("--json", action="store_true", help="print the rows as a JSON list")


def run(args: argparse.Namespace) -> int:
    if args.seeds < 1 or args.budget_s <= 0:
        raise InvalidConfigError("--seeds must be at least 1 and --budget-s positive", fix="e.g. --seeds 3 --budget-s 30")
    planners = tuple(p.strip() for p in args.planners.split(",") if p.strip())
    result = compare(args.model, mesh=args.mesh, hardware=args.hardware, seq_len=args.seq_len, global_batch=args.global_batch,
                     planners=planners, budget_s=args.budget_s, seeds=args.seeds)
    rows = [row.model_dump() for row in result.rows]
    if args.out_dir:
        write_csv(args.out_dir / "compare.csv", rows)
        write_csv(args.out_dir / "traces.csv", result.trace_rows())
        plot_traces(result, args.out_dir / "compare.png")
    if args.json:
        print(json.dumps(rows))
        return 0
    table = Table(title=f"{result.case}: {result.free_nodes} decisions", caption=_caption(result), caption_justify="left")
    for column in ("planner", "status", "step s", "vs ILP", "wall s", "first s", "≤1 % s", "evals"):
        table.add_column(column, no_wrap=True)
    for row in result.rows:
        table.add_row(row.planner, row.status, _num(row.step_time_s, ".4f"), _pct(row.gap_pct), _num(row.wall_s, ".2f"),
                      _num(row.first_feasible_s, ".2f"), _num(row.within_1pct_s, ".2f") if row.within_1pct_s is not None else "never",
                      f"{row.evaluations:,}")
    Console().print(table)
    return 0


def _caption(result: CompareResult) -> str:
    """What each column counts, the simulator's figure for the same stage, and a note for each row over 10 % above the ILP."""
    gap = 100 * (result.simulated_s / result.reference_s - 1)
    lines = ["step s: one stage's micro-batch step, every planner's choice costed by the same op-level model "
             "(per-op roofline, collectives, resharding), the ILP's objective; grid: the best Megatron-rule layout "
             "at its least time on it. vs ILP: percent above the ILP. first s, ≤1 % s: seconds to a first choice "
             "that fits, and to within 1 % of the ILP. evals: choices evaluated (ILP: its Boolean variables; "
             "grid: rule layouts).",
             f"The layout simulator predicts {result.simulated_s:.4f} s for this stage ({gap:+.1f} % from the ILP)."]
    lines += [f"{row.planner} {_pct(row.gap_pct)}: {row.note}" for row in result.rows if row.note]
    return "\n".join(lines)


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else f"{value:{fmt}}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f} %"
