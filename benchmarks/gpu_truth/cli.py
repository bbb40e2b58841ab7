"""``python -m benchmarks.gpu_truth``: the prepared measurement run (see the package docstring)."""

from __future__ import annotations

import argparse
import itertools
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks.gpu_truth.micro import attention_cases, elementwise_cases, gemm_cases, hbm_cases
from benchmarks.gpu_truth.profile import decode_groups, profile_rows, step_groups, traced_steps
from benchmarks.gpu_truth.report import print_rows, step_summary, write_run_csv
from benchmarks.gpu_truth.serving import decode_cases, decode_train, predicted_serving, prefill_cases, prepared_serving_step
from benchmarks.gpu_truth.sizes import sizes_for
from benchmarks.gpu_truth.steps import CHOICE, planner_choices, prepared_step, step_cases
from benchmarks.gpu_truth.target import Target, detect_target
from benchmarks.gpu_truth.timing import KINDS, Case, Row, run_cases
from benchmarks.output import print_table, write_csv

_CASES = {"hbm": hbm_cases, "elementwise": elementwise_cases, "gemm": gemm_cases, "step": step_cases,
          "attention": attention_cases, "decode": decode_cases, "prefill": prefill_cases}
DEFAULT_OUT_DIR = Path(__file__).resolve().parents[1] / "data" / "gpu"
# Of the device's memory, what JAX may take (its default, 75 %, leaves the 8B step without room).
_GPU_MEMORY_FRACTION = "0.92"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (module docstring).

    >>> parse_args(["--backend", "cpu", "--quick"]).time_budget_s
    450.0
    """
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_truth", description=__doc__)
    parser.add_argument("--backend", choices=("gpu", "cpu"), default="gpu", help="where to measure (default gpu)")
    parser.add_argument("--quick", action="store_true", help="toy sizes: the CPU check, well under two minutes")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR, help="folder of the run's CSV (default benchmarks/data/gpu)")
    parser.add_argument("--time-budget-s", type=float, default=450.0,
                        help="stop measuring new cases after this many seconds; the rest are listed as skipped (default 450)")
    parser.add_argument("--only", action="append", choices=KINDS, metavar="KIND",
                        help=f"measure only cases of this kind (repeatable; one of {', '.join(KINDS)}; default all)")
    parser.add_argument("--profile", action="store_true",
                        help="then trace 3 steps of each step model's planner's choice and of two decode cases, and write "
                             "where the time goes, kernel category by category, beside the simulator's terms (<run>_profile.csv)")
    parser.add_argument("--hardware", help="hardware profile predicting the device (default: detected from the GPU, or the "
                                           "measured cpu profile)")
    return parser.parse_args(argv)


def all_cases(target: Target, only: list[str] | None = None) -> list[Case]:
    """Every case (of the ``only`` kinds, if named), the kinds interleaved (one of each in turn) so a
    budget that runs out leaves every kind measured."""
    sizes = sizes_for(quick=target.quick)
    kinds = [cases(target, sizes) for kind, cases in _CASES.items() if not only or kind in only]
    return [case for turn in itertools.zip_longest(*kinds) for case in turn if case is not None]


def profile_choices(target: Target, rows: list[Row], console: Console) -> list[dict[str, Any]]:
    """`benchmarks.gpu_truth.profile`'s rows for each step model's planner's choice and for the
    first two decode cases, each beside its measured time from ``rows``."""
    sizes = sizes_for(quick=target.quick)
    measured = {r.group: r.measured_s for r in rows if r.kind == "step" and r.note == CHOICE}
    measured |= {r.case: r.measured_s for r in rows}  # a decode case by its name
    profiles = []
    for model, plan in planner_choices(target, sizes):
        console.print(f"profiling {model} {CHOICE}", highlight=False)
        profiles += profile_rows(model, measured.get(model), step_groups(plan.predicted),
                                 lambda plan=plan: traced_steps(*prepared_step(plan)))
    for batch, context in sizes.decode_cases[:2]:
        model, train = sizes.decode_model, decode_train(target, batch, context)
        name = f"{model.name} decode b{batch} ctx{context}"
        console.print(f"profiling {name}", highlight=False)
        profiles += profile_rows(name, measured.get(name), decode_groups(predicted_serving(target, model, train)),
                                 lambda model=model, train=train: traced_steps(*prepared_serving_step(model, train)))
    return profiles


def main(argv: list[str] | None = None) -> int:
    """Run every case, write the CSV, print the table and the full steps' summary; 0 once the CSV is written."""
    args = parse_args(argv)
    if args.backend == "gpu":
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", _GPU_MEMORY_FRACTION)
    else:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    console = Console(width=200)
    start = time.perf_counter()
    target = detect_target(args.backend, quick=args.quick, hardware=args.hardware)
    console.print(f"{target.device} (driver {target.driver or 'none'}), jax {target.jax_version}, profile {target.cluster.name}, "
                  f"{target.dtype}")
    cases = all_cases(target, args.only)

    def progress(row: Row) -> None:
        measured = "-" if row.measured_s is None else f"{row.measured_s * 1e3:.4g} ms"
        console.print(f"[{time.perf_counter() - start:6.1f} s] {row.kind:<11} {row.case:<40} {measured:>12}  {row.error[:80]}",
                      highlight=False)

    rows = run_cases(cases, budget_s=args.time_budget_s, on_row=progress)
    path = write_run_csv(rows, target, args.out_dir)
    if args.profile:
        profile_path = path.with_name(f"{path.stem}_profile.csv")
        profiles = profile_choices(target, rows, console)
        write_csv(profile_path, profiles)
        print_table(f"Where the planner's choice's step time goes on {target.device} (seconds per step)", profiles, console=console)
        console.print(f"wrote {profile_path}", highlight=False)
    print_rows(rows, target, console)
    for line in step_summary(rows):
        console.print(line, highlight=False)
    skipped = [r.case for r in rows if r.error.startswith("skipped")]
    if skipped:
        console.print(f"skipped for the time budget ({len(skipped)}): {', '.join(skipped)}", highlight=False)
    failed = sum(1 for r in rows if r.error and not r.error.startswith("skipped"))
    console.print(f"{len(rows)} cases, {failed} failed, {len(skipped)} skipped, {time.perf_counter() - start:.0f} s; wrote {path}",
                  highlight=False)
    return 0
