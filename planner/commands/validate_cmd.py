"""``plan validate plan.json --compile-only``: compile the plan on its mesh and compare."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from costmodel.errors import InvalidConfigError, UnsupportedError, first_problem, read_user_file

_GIB = 2**30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", help="a plan JSON written by `plan ... --out`")
    parser.add_argument("--compile-only", action="store_true", help="lower and compile from abstract inputs (no run)")
    parser.add_argument("--tolerance", type=float, default=0.05, help="allowed |actual/predicted - 1| (default 0.05)")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")


def run(args: argparse.Namespace) -> int:
    # The validator imports planner; the CLI loads it only for this command (DESIGN: composition root).
    from planner.schema import Plan
    from validate.compile_check import compile_in_subprocess
    from validate.report import checks

    if not args.compile_only:
        raise UnsupportedError("timed validation is not built yet", fix="use --compile-only")
    try:
        plan = Plan.model_validate_json(read_user_file(Path(args.plan), "plan file"))
    except ValidationError as err:
        where, msg, _ = first_problem(err)
        raise InvalidConfigError(f"{args.plan}: {where}: {msg}", fix="regenerate the plan with plan ... --out") from None
    report = compile_in_subprocess(plan)
    results = checks(plan, report, tolerance=args.tolerance)
    if args.json:
        print(json.dumps({"checks": [{**c.model_dump(), "ratio": c.ratio, "ok": c.ok} for c in results],
                          "compile": report.model_dump()}, sort_keys=True))
    else:
        table = Table(title=f"{plan.model.name}: compiled on {report.n_devices} emulated devices in {report.compile_time_s:.1f} s")
        for col in ("item", "predicted", "compiled", "ratio", "ok"):
            table.add_column(col)
        for c in results:
            table.add_row(c.item, f"{c.predicted / _GIB:.2f} GiB", f"{c.actual / _GIB:.2f} GiB", f"{c.ratio:.3f}", "yes" if c.ok else "NO")
        table.add_row("temporaries (CPU backend)", "-", f"{report.temp_bytes / _GIB:.2f} GiB", "-", "-")
        table.add_row("collectives (static count)", "-", ", ".join(f"{k} {v}" for k, v in report.collectives.items()), "-", "-")
        Console().print(table)
    return 0 if all(c.ok for c in results) else 1
