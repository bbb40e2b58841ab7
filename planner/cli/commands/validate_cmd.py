"""``plan validate plan.json [--compile-only] [--processes N]``: compile the plan on its mesh and compare, item by item.

Without ``--compile-only`` the plan's step also runs on this host's emulated CPU devices
and its measured step time (median of repeats) is compared with the simulator's on the
``cpu`` profile measured for that device count (`validate.timed.step_time_check`): a
check for models small enough to run here.

Exit status: 0 when every predicted item is within tolerance, 1 when one is not (so it can
sit in a user's CI), the error catalog's codes for bad input.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from costmodel.errors import InvalidConfigError, UnsupportedError, first_problem, read_user_file
from planner.cli.commands.arg_types import positive_float, positive_int
from planner.plan_schema import Plan
from planner.programs.decode import check_serving_lowered
from validate.compile_check import CompileReport, compile_in_subprocess
from validate.multihost import run_processes, validate_processes
from validate.report import (
    FLOPS_TOLERANCE,
    MEMORY_TOLERANCE,
    checks,
    features_not_predicted,
    fp8_frozen_not_checked,
    offload_not_checked,
    refuse_optimizer_options,
    refuse_unlowered_attention,
    refuse_unlowered_weights,
)
from validate.timed import step_time_check

_GIB = 2**30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", help="a plan JSON written by `plan ... --out`")
    parser.add_argument("--compile-only", action="store_true", help="lower and compile from abstract inputs (no run)")
    parser.add_argument("--tolerance", type=positive_float, default=0.05,
                        help=f"allowed |actual/predicted - 1| for bytes (default 0.05; FLOPs {FLOPS_TOLERANCE}, "
                             f"total memory at least {MEMORY_TOLERANCE})")
    parser.add_argument("--processes", type=positive_int, default=1,
                        help="JAX processes on this host (jax.distributed over 127.0.0.1) forming one mesh (default 1)")
    parser.add_argument("--steps", type=positive_int, default=3, help="timed steps per repeat (default 3)")
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed repeats; the median counts (default 5)")
    parser.add_argument("--time-tolerance", type=positive_float, default=0.25,
                        help="allowed |measured/predicted - 1| for the step time (default 0.25)")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")


def _format(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    scales = {"bytes": ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B")),
              "flops": ((1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP"), (1, "FLOP"))}.get(unit)
    if scales is None:
        return f"{value:.4g} {unit}"
    size, name = next(((size, name) for size, name in scales if abs(value) >= size), scales[-1])
    return f"{value / size:.3f} {name}"


def run(args: argparse.Namespace) -> int:
    # These read the reference JAX programs: JAX loads only when a plan is validated.

    if not args.compile_only and args.processes > 1:
        raise UnsupportedError("the timed check runs in one process", fix="add --compile-only, or drop --processes")
    if min(args.steps, args.repeats) < 1:
        raise InvalidConfigError(f"--steps={args.steps} --repeats={args.repeats}: both must be at least 1",
                                 fix="use e.g. --steps 3 --repeats 5")
    try:
        plan = Plan.model_validate_json(read_user_file(Path(args.plan), "plan file"))
    except ValidationError as err:
        where, msg, _ = first_problem(err)
        raise InvalidConfigError(f"{args.plan}: {where}: {msg}", fix="regenerate the plan with plan ... --out") from None
    refuse_unlowered_weights(plan)
    refuse_unlowered_attention(plan)
    refuse_optimizer_options(plan)
    if not plan.train.workload.runs_backward:
        check_serving_lowered(plan.model)  # before any process starts
        if not args.compile_only:
            raise UnsupportedError(f"the timed check runs training steps; a {plan.train.workload.kind} plan is checked compiled only",
                                   fix="add --compile-only")
    not_checked = offload_not_checked(plan)
    if not_checked and not args.compile_only:
        raise UnsupportedError("the timed check does not run offloaded plans (the host offload is not lowered)",
                               fix="add --compile-only")
    if args.processes == 1:
        report = compile_in_subprocess(plan)
    else:
        per_process = validate_processes(args.processes, plan.layout.n_devices)
        report = CompileReport.model_validate_json(run_processes("validate.multihost:compile_plan_json", plan.model_dump_json(),
                                                                 n_processes=args.processes, devices_per_process=per_process))
    results = checks(plan, report, tolerance=args.tolerance)
    not_checked = not_checked or fp8_frozen_not_checked(plan, platform=report.platform)
    timed = None
    if not args.compile_only:
        step, timed = step_time_check(plan, compiled_peak_bytes=report.peak_bytes, steps=args.steps, repeats=args.repeats,
                                      tolerance=args.time_tolerance)
        results.insert(0, step)
    unpredicted = features_not_predicted(plan)
    if args.json:
        print(json.dumps({"checks": [c.model_dump() for c in results], "unpredicted": unpredicted, "not_checked": not_checked,
                          "compile": report.model_dump(exclude={"collectives"}) | {"peak_bytes": report.peak_bytes},
                          "timed": timed.model_dump() if timed else None}, sort_keys=True))
    else:
        title = (f"{plan.model.name}: compiled on {report.n_devices} emulated devices ({report.n_processes} process"
                 f"{'es' if report.n_processes > 1 else ''}) in {report.compile_time_s:.1f} s, "
                 f"peak RSS {report.peak_rss_bytes / _GIB:.2f} GiB")
        table = Table(title=title)
        for col in ("item", "axis", "predicted", "actual", "source", "ratio", "ok"):
            table.add_column(col)
        for c in results:
            ok = "-" if c.ok is None else "yes" if c.ok else "NO"
            table.add_row(c.item, c.axis or "", _format(c.predicted, c.unit), _format(c.actual, c.unit), c.source,
                          "-" if c.ratio is None else f"{c.ratio:.3f}", ok)
        table.add_row("temporaries (CPU backend)", "", "-", _format(report.temp_bytes, "bytes"), "compiled", "-", "-")
        console = Console()
        console.print(table)
        if timed:
            console.print(f"step time: median of {args.repeats} repeats of {args.steps} steps on {timed.n_devices} emulated CPU "
                          f"device(s), spread {timed.spread:.0%}; predicted on the measured cpu profile (float32)")
        if unpredicted:
            console.print(f"collectives not predicted for: {', '.join(unpredicted)}")
        if not_checked:
            console.print(not_checked)
    return 0 if all(c.ok is not False for c in results) else 1
