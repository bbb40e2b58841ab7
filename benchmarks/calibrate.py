"""One calibration per hardware type: fit a profile's efficiencies over all its published runs.

For each hardware type in ``../shared/data/published_training_runs.csv`` this fits the
few efficiencies of its profile that micro-benchmarks leave uncertain — a scale on the
GEMM efficiency curve and where it bends (a shift along FLOPs), the fused-attention
efficiency and the HBM efficiency — to
minimise the mean absolute step-time error over *all* runs on that hardware (coordinate
descent on a grid; never one run alone). Hardware types with fewer than three runs per
free parameter fit only the GEMM scale. It then reports 5-fold cross-validated error, the
honest estimate for runs not in the data, and prints the values to put in
``costmodel/catalog.py``.

    python -m benchmarks.calibrate [--data PATH] [--out benchmarks/out/calibration.csv]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from benchmarks.output import write_csv
from benchmarks.simulator_accuracy import DEFAULT_DATA, layout_from_row, model_from_row
from costmodel.catalog import MICROBENCHMARK_EFFICIENCY
from costmodel.machine import load_machine
from costmodel.roofline import Efficiency
from costmodel.simulator import simulate
from costmodel.train_config import TrainConfig

# Parts that are one hardware type under two names (torchtitan's capped H100 reported with
# 95 and 96 GB) share one calibration.
HARDWARE_TYPE = {"h100-95gb-hbm2e-lowtdp": "h100-96gb-hbm2e-500w"}
# Fewer runs than this per fitted parameter and only the GEMM scale is fitted.
RUNS_PER_FREE_PARAMETER = 3
GRID = {
    "matmul_scale": [0.70 + 0.02 * i for i in range(16)],
    "matmul_knee": [0.01, 0.03, 0.1, 0.3, 1.0],
    "flash_attention": [0.25 + 0.05 * i for i in range(10)],
    "hbm": [0.60 + 0.05 * i for i in range(8)],
}


def _start(hardware: str) -> Efficiency:
    return MICROBENCHMARK_EFFICIENCY.get(hardware, load_machine(hardware).efficiency)


def errors_pct(rows: list[dict[str, str]], params: dict[str, float]) -> list[float]:
    """Signed step-time error of each row with its hardware's micro-benchmark efficiencies adjusted by ``params``."""
    out = []
    for row in rows:
        machine = load_machine(row["hardware"], devices_per_node=int(row["devices_per_node"]))
        machine = machine.model_copy(update={"efficiency": _start(row["hardware"]).calibrated(**params)})
        train = TrainConfig(seq_len=int(row["seq_len"]), global_batch=int(row["global_batch_seqs"]))
        est = simulate(model_from_row(row), train, layout_from_row(row), machine)
        measured = float(row["derived_step_time_s"])
        out.append(100 * (est.step_time_s - measured) / measured)
    return out


def _mean_abs(values: list[float]) -> float:
    return statistics.mean(abs(v) for v in values)


def fit(rows: list[dict[str, str]], start: dict[str, float], free: list[str], *, rounds: int = 3) -> dict[str, float]:
    """Coordinate descent over ``GRID`` for the ``free`` parameters."""
    params = dict(start)
    for _ in range(rounds):
        changed = False
        for name in free:
            best = min(GRID[name], key=lambda v: _mean_abs(errors_pct(rows, {**params, name: v})))
            changed |= best != params[name]
            params[name] = best
        if not changed:
            break
    return params


def cross_validated(rows: list[dict[str, str]], start: dict[str, float], free: list[str], folds: int = 5) -> list[float]:
    """Each row's error when the calibration was fitted without it (k-fold)."""
    errors: list[float] = [0.0] * len(rows)
    for k in range(folds):
        test = [i for i in range(len(rows)) if i % folds == k]
        train_rows = [r for i, r in enumerate(rows) if i % folds != k]
        params = fit(train_rows, start, free, rounds=2)
        for i, err in zip(test, errors_pct([rows[i] for i in test], params)):
            errors[i] = err
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/calibration.csv"))
    args = parser.parse_args(argv)
    with args.data.open() as f:
        by_type: dict[str, list[dict[str, str]]] = defaultdict(list)
        for row in csv.DictReader(f):
            by_type[HARDWARE_TYPE.get(row["hardware"], row["hardware"])].append(row)
    results = []
    for hardware, rows in sorted(by_type.items()):
        base = _start(hardware)
        start = {"matmul_scale": 1.0, "matmul_knee": 1.0, "flash_attention": base.flash_attention, "hbm": base.hbm}
        free = list(GRID) if len(rows) >= RUNS_PER_FREE_PARAMETER * len(GRID) else ["matmul_scale"]
        before = errors_pct(rows, start)
        params = fit(rows, start, free)
        after = errors_pct(rows, params)
        held_out = cross_validated(rows, start, free) if len(rows) >= 10 else None
        print(f"{hardware}: {len(rows)} runs, free {free}")
        print(f"  mean |error| micro-benchmark efficiencies {_mean_abs(before):.2f} %, calibrated {_mean_abs(after):.2f} % "
              f"(max {max(map(abs, after)):.2f} %)")
        if held_out:
            print(f"  5-fold held-out mean |error| {_mean_abs(held_out):.2f} % (max {max(map(abs, held_out)):.2f} %)")
        print(f"  catalog: calibrated(matmul_scale={params['matmul_scale']:.2f}, matmul_knee={params['matmul_knee']}, "
              f"flash_attention={params['flash_attention']:.2f}, hbm={params['hbm']:.2f})")
        results.append({"hardware": hardware, "runs": len(rows), **{k: round(v, 3) for k, v in params.items()},
                        "mean_abs_err_uncalibrated_pct": round(_mean_abs(before), 2), "mean_abs_err_pct": round(_mean_abs(after), 2),
                        "max_abs_err_pct": round(max(map(abs, after)), 2),
                        "heldout_mean_abs_err_pct": round(_mean_abs(held_out), 2) if held_out else ""})
    write_csv(args.out, results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
