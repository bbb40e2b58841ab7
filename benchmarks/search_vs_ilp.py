"""Search planners against the ILP on one strategy space, over a fixed suite of cases.

    python -m benchmarks.search_vs_ilp [--seeds 2] [--factor 10] [--ilp-limit-s 60] [--out-dir benchmarks/out/search_vs_ilp]

For each case the layout search picks the outer knobs; one stage's training step on its
non-pipeline axes is the strategy space. The ILP solves it (time limit --ilp-limit-s);
each search planner then gets --factor times the ILP's wall time per seed (or, for the
case with its own short ILP limit, that same time). "grid" is the hand-tuning grid of
axis roles (data or tensor, ZeRO-3 or not) with the other ops descending. Prints one
table (per case and planner: objective, gap to the ILP, time to within 1 %), writes
summary.csv, traces.csv and summary.png (one panel per case).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from benchmarks.output import print_table, write_csv
from planner.compare import CompareResult, compare, draw_traces, pyplot

# (model, mesh, hardware, seq_len, global batch, ILP time limit): 8, 32 and 256 devices; the
# 32x8 case is memory-tight. With a limit of its own the ILP may stop short of the optimum
# and every search planner gets that same time (equal-time comparison); otherwise search
# gets --factor times the ILP's wall time.
CASES = (
    ("gpt2-xl", "2x4", "a100-80gb", 1024, 64, None),
    ("llama3-8b", "2x4", "a100-40gb", 4096, 32, None),
    ("llama3-8b", "8x4", "h100-sxm", 4096, 256, None),
    ("llama3-70b", "8x4", "h100-sxm", 4096, 256, None),
    ("mixtral-8x7b", "8x4", "h100-sxm", 4096, 256, None),
    ("llama3-70b", "32x8", "h100-sxm", 4096, 1024, None),
    ("llama3-70b", "32x8", "h100-sxm", 4096, 1024, 1.0),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--factor", type=float, default=10.0, help="search wall budget as a multiple of the ILP's")
    parser.add_argument("--ilp-limit-s", type=float, default=60.0)
    parser.add_argument("--out-dir", type=Path, default=Path("benchmarks/out/search_vs_ilp"))
    args = parser.parse_args(argv)
    results: list[CompareResult] = []
    rows = []
    for model, mesh, hardware, seq_len, batch, ilp_limit_s in CASES:
        result = compare(model, mesh=mesh, hardware=hardware, seq_len=seq_len, global_batch=batch,
                         budget_s=ilp_limit_s or args.ilp_limit_s, seeds=args.seeds,
                         search_time_factor=None if ilp_limit_s else args.factor)
        results.append(result)
        for row in result.rows:
            rows.append({"model": model, "mesh": mesh, "hardware": hardware, "ilp_limit_s": ilp_limit_s or args.ilp_limit_s,
                         "search_budget": "equal time" if ilp_limit_s else f"{args.factor:g}x ILP", "decisions": result.free_nodes,
                         "memory_pct": round(100 * result.memory_fraction, 1), "planner": row.planner, "status": row.status,
                         "objective_s": _round(row.step_time_s, 5), "gap_pct": _round(row.gap_pct, 2),
                         "wall_s": round(row.wall_s, 2), "within_1pct_s": _round(row.within_1pct_s, 2),
                         "evaluations": row.evaluations, "ilp_bound_gap_pct": _round(row.ilp_bound_gap_pct, 3)})
    print_table(f"Search planners vs the ILP (search budget {args.factor:g}× the ILP's time, {args.seeds} seeds, medians)", rows)
    write_csv(args.out_dir / "summary.csv", rows)
    write_csv(args.out_dir / "traces.csv", [{"case": r.case, **row} for r in results for row in r.trace_rows()])
    plt = pyplot()
    columns = 2
    fig, axes = plt.subplots(math.ceil(len(results) / columns), columns, figsize=(12, 3.6 * math.ceil(len(results) / columns)))
    for result, ax in zip(results, axes.flat):
        draw_traces(result, ax)
    fig.tight_layout()
    fig.savefig(args.out_dir / "summary.png", dpi=110)
    print(f"wrote {args.out_dir}/summary.csv, traces.csv, summary.png")
    return 0


def _round(value: float | None, digits: int) -> float | str:
    return "" if value is None else round(value, digits)


if __name__ == "__main__":
    sys.exit(main())
