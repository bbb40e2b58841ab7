"""Planner quality: for every published run, plan it blind and compare with the published layout.

Given only a row's model, device count, hardware, sequence length and global batch (and
the facts of its software stack: attention kernel, overlap, fused kernels, ...), the planner
chooses a layout; both layouts are costed by the same simulator. The planner should be
predicted at least as fast as the published layout, and fit.

    python -m benchmarks.plan_quality [--data PATH] [--out benchmarks/out/plan_quality.csv]
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

from benchmarks.output import print_table, write_csv
from benchmarks.simulator_accuracy import DEFAULT_DATA, layout_from_row, machine_from_row, model_from_row, train_from_row
from costmodel.errors import PlannerError
from costmodel.inputs.layout import Layout
from costmodel.step.simulator import simulate
from search.layouts import SearchSpace, grid_search


def _describe(layout: Layout) -> str:
    return (f"tp{layout.tp} pp{layout.pp} dp{layout.dp} v{layout.interleave} mb{layout.micro_batch} "
            f"{layout.recompute} z{layout.zero_stage}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/plan_quality.csv"))
    args = parser.parse_args(argv)
    with args.data.open() as f:
        rows = list(csv.DictReader(f))
    results = []
    for row in rows:
        model, train, machine = model_from_row(row), train_from_row(row), machine_from_row(row)
        published = layout_from_row(row, machine)
        reference = simulate(model, train, published, machine)
        space = SearchSpace(stack=published)
        start = time.perf_counter()
        try:
            found = grid_search(model, train, machine, n_devices=published.n_devices, space=space).best
            chosen, chosen_s, fits = _describe(found.layout), found.step_time_s, found.fits
        except PlannerError as err:
            chosen, chosen_s, fits = f"none: {err.cause[:60]}", float("inf"), False
        results.append({
            "model": row["model"], "devices": published.n_devices, "published": _describe(published),
            "published_s": reference.step_time_s, "published_fits": reference.fits, "planned": chosen, "planned_fits": fits,
            "planned_s": chosen_s,
            "speedup": reference.step_time_s / chosen_s, "plan_time_s": time.perf_counter() - start,
        })
    print_table("Planner vs published layout, same cost model", results)
    wins = sum(r["speedup"] >= 1 - 1e-9 for r in results)
    print(f"planned at least as fast as published: {wins}/{len(results)}")
    write_csv(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
