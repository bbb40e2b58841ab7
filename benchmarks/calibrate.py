"""One calibration per hardware type: fit a profile's efficiencies over all its published runs.

For each hardware type in ``../shared/data/published_training_runs.csv`` this fits the
few efficiencies of its profile that micro-benchmarks leave uncertain — a scale on the
GEMM efficiency curve and where it bends (a shift along FLOPs), the fused-attention
efficiency, the HBM efficiency and how much a collective slows the compute beside it — to
minimise the mean absolute step-time error over *all* runs on that hardware, never one run
alone. The fit is an exhaustive search of `GRID`: every run is simulated once at every
grid point, so the fit and its two held-out estimates read one table of errors: 5-fold
cross-validation (random folds: each fold fitted without its runs) and leave-one-source-out
(each source predicted by the fit to that hardware's other sources, or, where no other
source ran on it, by the GEMM scale that other parts of its chip were fitted to: the
estimate for a new framework's or paper's runs). A hardware type fits as many of `GRID`'s
parameters, in order, as it has three runs for each (`free_parameters`). Every fitted efficiency is checked against its stated
physical range (`PHYSICAL_RANGE`). It prints the values to put in ``costmodel/hardware/catalog.py``.

    python -m benchmarks.calibrate [--data PATH] [--hardware NAME] [--out benchmarks/out/calibration.csv]
"""

from __future__ import annotations

import argparse
import csv
import itertools
import statistics
import sys
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from benchmarks.output import write_csv
from benchmarks.simulator_accuracy import (
    DEFAULT_DATA,
    MICROBENCHMARK_GEMM_SCALES,
    chip_transfer_pct,
    hardware_type,
    microbenchmark_efficiency,
    source_family,
    step_error_pct,
)
from costmodel.step.roofline import Efficiency

# Fewer runs than this per fitted parameter and that parameter is not fitted (`free_parameters`).
RUNS_PER_FREE_PARAMETER = 3
# Each efficiency within what kernels and micro-benchmarks reach: fused attention 0.35–0.70
# of peak (FlashAttention-2 from short to long sequences), memory-bound kernels 0.50–0.90 of
# HBM bandwidth, and compute beside a collective slowed by 0–0.30.
GRID = {
    "matmul_scale": list(MICROBENCHMARK_GEMM_SCALES),
    "matmul_knee": [0.01, 0.1, 1.0, 3.0, 10.0],
    "flash_attention": [round(0.35 + 0.05 * i, 2) for i in range(8)],
    "hbm": [round(0.50 + 0.05 * i, 2) for i in range(9)],
    "overlap_slowdown": [round(0.05 * i, 2) for i in range(7)],
}
FOLDS = 5
# What each fitted efficiency may physically be, as a fraction of the device's peak: large
# bf16 GEMMs reach 0.55–0.90 (cuBLAS on A100/H100 at the low end under power or clock
# limits, the best micro-benchmarks at the top), fused attention 0.30–0.75
# (FlashAttention-2/3), streaming kernels 0.50–0.92 of HBM bandwidth, and compute beside
# a collective loses 0–0.30 (NCCL's 16–32 SMs of 108–132, plus its HBM traffic).
PHYSICAL_RANGE = {"large_gemm": (0.55, 0.90), "flash_attention": (0.30, 0.75), "hbm": (0.50, 0.92), "overlap_slowdown": (0.0, 0.30)}


def errors_pct(rows: list[dict[str, str]], params: dict[str, float]) -> list[float]:
    """Signed step-time error of each row with its hardware's micro-benchmark efficiencies adjusted by ``params``."""
    return [step_error_pct(row, microbenchmark_efficiency(row["hardware"]).calibrated(**params)) for row in rows]


def free_parameters(runs: int) -> list[str]:
    """The `GRID` parameters ``runs`` runs may fit, in `GRID` order, `RUNS_PER_FREE_PARAMETER` runs each (at least the GEMM scale).

    >>> free_parameters(11), len(free_parameters(24))
    (['matmul_scale', 'matmul_knee', 'flash_attention'], 5)
    """
    return list(GRID)[:max(1, min(len(GRID), runs // RUNS_PER_FREE_PARAMETER))]


def grid_points(start: dict[str, float], free: list[str]) -> list[dict[str, float]]:
    """Every combination of the ``free`` parameters' `GRID` values, the others at ``start``."""
    return [{**start, **dict(zip(free, values))} for values in itertools.product(*(GRID[name] for name in free))]


def error_table(rows: list[dict[str, str]], points: list[dict[str, float]], *, workers: int | None = None) -> np.ndarray:
    """Signed error (%) of every row (columns) at every grid point (rows), simulated in parallel."""
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return np.array(list(pool.map(errors_pct, itertools.repeat(rows), points, chunksize=64)))


def best_point(table: np.ndarray, runs: list[int]) -> int:
    """The grid point with the least mean absolute error over the runs (columns) ``runs``."""
    return int(np.argmin(np.abs(table[:, runs]).mean(axis=1)))


def cross_validated(table: np.ndarray, folds: int = FOLDS) -> np.ndarray:
    """Each run's error at the grid point fitted without it (``folds``-fold)."""
    n = table.shape[1]
    held_out = np.zeros(n)
    for k in range(folds):
        test = [i for i in range(n) if i % folds == k]
        fitted = best_point(table, [i for i in range(n) if i % folds != k])
        held_out[test] = table[fitted, test]
    return held_out


def _mean_abs(values: np.ndarray | list[float]) -> float:
    return statistics.mean(abs(float(v)) for v in values)


def leave_one_source_out(table: np.ndarray, sources: list[str], fallback: list[float]) -> np.ndarray:
    """Each run's error at the grid point fitted to the other sources' runs; ``fallback`` (the
    micro-benchmark efficiencies' errors) where its source is the only one.

    >>> t = np.array([[1.0, 1.0, 9.0], [5.0, 5.0, 0.0]])
    >>> leave_one_source_out(t, ["a", "a", "b"], [7.0, 7.0, 7.0]).tolist()
    [5.0, 5.0, 9.0]
    """
    held_out = np.array(fallback, dtype=float)
    for source in sorted(set(sources)):
        test = [i for i, s in enumerate(sources) if s == source]
        train = [i for i, s in enumerate(sources) if s != source]
        if train:
            held_out[test] = table[best_point(table, train), test]
    return held_out


def physical_check(eff: Efficiency) -> dict[str, tuple[float, bool]]:
    """Each fitted efficiency (largest-GEMM, attention, HBM, overlap) and whether it is in `PHYSICAL_RANGE`.

    >>> physical_check(Efficiency(matmul_curve=((1e12, 0.95),)))["large_gemm"]
    (0.95, False)
    """
    values = {"large_gemm": eff.matmul_curve[-1][1], "flash_attention": eff.flash_attention, "hbm": eff.hbm,
              "overlap_slowdown": eff.overlap_slowdown}
    return {k: (v, PHYSICAL_RANGE[k][0] <= v <= PHYSICAL_RANGE[k][1]) for k, v in values.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--hardware", action="append", help="fit only this hardware type (repeatable; default all)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/calibration.csv"))
    args = parser.parse_args(argv)
    with args.data.open() as f:
        all_rows = list(csv.DictReader(f))
    by_type: dict[str, list[dict[str, str]]] = defaultdict(list)
    for row in all_rows:
        by_type[hardware_type(row)].append(row)
    results, loso_all = [], []
    for hardware, rows in sorted(by_type.items()):
        if args.hardware and hardware not in args.hardware:
            continue
        base = microbenchmark_efficiency(hardware)
        start = {"matmul_scale": 1.0, "matmul_knee": 1.0, "flash_attention": base.flash_attention, "hbm": base.hbm,
                 "overlap_slowdown": base.overlap_slowdown}
        free = free_parameters(len(rows))
        points = grid_points(start, free)
        table = error_table(rows, points)
        params = points[best_point(table, list(range(len(rows))))]
        before, after = errors_pct(rows, start), errors_pct(rows, params)
        held_out = cross_validated(table) if len(rows) >= 2 * FOLDS else None
        sources = [source_family(r) for r in rows]
        # Only a type with one source falls back, on what other parts of its chip teach.
        fallback = chip_transfer_pct(rows, all_rows) if len(set(sources)) == 1 else before
        loso = leave_one_source_out(table, sources, fallback)
        loso_all += list(loso)
        print(f"{hardware}: {len(rows)} runs, free {free}, {len(points)} grid points")
        print(f"  mean |error| micro-benchmark efficiencies {_mean_abs(before):.2f} %, calibrated {_mean_abs(after):.2f} % "
              f"(max {max(map(abs, after)):.2f} %)")
        if held_out is not None:
            print(f"  {FOLDS}-fold held-out mean |error| {_mean_abs(held_out):.2f} % (max {np.abs(held_out).max():.2f} %)")
        print(f"  leave-one-source-out mean |error| {_mean_abs(loso):.2f} % (max {np.abs(loso).max():.2f} %)")
        fitted = microbenchmark_efficiency(hardware).calibrated(**params)
        for name, (value, inside) in physical_check(fitted).items():
            low, high = PHYSICAL_RANGE[name]
            print(f"  {name} {value:.3f} {'inside' if inside else 'OUTSIDE'} [{low}, {high}]")
        print(f"  catalog: calibrated(matmul_scale={params['matmul_scale']:.2f}, matmul_knee={params['matmul_knee']}, "
              f"flash_attention={params['flash_attention']:.2f}, hbm={params['hbm']:.2f}, "
              f"overlap_slowdown={params['overlap_slowdown']:.2f})")
        results.append({"hardware": hardware, "runs": len(rows), **{k: round(v, 3) for k, v in params.items()},
                        "mean_abs_err_uncalibrated_pct": round(_mean_abs(before), 2), "mean_abs_err_pct": round(_mean_abs(after), 2),
                        "max_abs_err_pct": round(max(map(abs, after)), 2),
                        "heldout_mean_abs_err_pct": round(_mean_abs(held_out), 2) if held_out is not None else "",
                        "heldout_max_abs_err_pct": round(float(np.abs(held_out).max()), 2) if held_out is not None else "",
                        "loso_mean_abs_err_pct": round(_mean_abs(loso), 2), "loso_max_abs_err_pct": round(float(np.abs(loso).max()), 2),
                        "physically_plausible": all(inside for _, inside in physical_check(fitted).values())})
    if loso_all:
        print(f"all hardware: leave-one-source-out mean |error| {_mean_abs(loso_all):.2f} % (max {max(map(abs, loso_all)):.2f} %)")
    write_csv(args.out, results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
