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

With ``--measured``, the efficiencies come from a real device instead: the GEMM curve's scale
and bend, the fused-attention and the HBM efficiency of the profile a `benchmarks.gpu_truth`
CSV was predicted with are fitted to its measured micro-benchmarks within `PHYSICAL_RANGE`
(`benchmarks.calibrate_measured`); the published runs of that hardware type are then reported
before (the published-figures fit, as above) and after (the measured efficiencies, only the
`GRID` parameters they leave free fitted to the runs), mean, max and leave-one-source-out; and
the measured profile is written beside the catalog's, ``<profile-dir>/<hardware>-measured.json``
(`ClusterSpec` JSON, for ``--hardware PATH``).

    python -m benchmarks.calibrate [--data PATH] [--hardware NAME] [--out benchmarks/out/calibration.csv]
    python -m benchmarks.calibrate --measured benchmarks/data/gpu/RUN.csv [--measured ...] [--profile-dir benchmarks/data/gpu/profiles]
"""

from __future__ import annotations

import argparse
import csv
import itertools
import multiprocessing
import statistics
import sys
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.calibrate_measured import fit_measured, measured_profile, read_measured, write_profile
from benchmarks.output import print_table, write_csv
from benchmarks.simulator_accuracy import (
    DEFAULT_DATA,
    MICROBENCHMARK_GEMM_SCALES,
    chip_transfer_pct,
    hardware_type,
    microbenchmark_efficiency,
    source_family,
    step_error_pct,
)
from costmodel.errors import InvalidConfigError
from costmodel.hardware.registry import load_hardware
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

# Where ``--measured`` writes the profiles it fits, beside the measurements (`benchmarks.gpu_truth`'s CSVs).
PROFILE_DIR = Path(__file__).resolve().parent / "data" / "gpu" / "profiles"


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
    # Spawned, not forked: the measured path has imported JAX, whose threads a fork would copy mid-lock.
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
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


@dataclass(frozen=True)
class HardwareFit:
    """One hardware type's fit over its published runs: the errors before and after, and the two held-out estimates."""

    free: list[str]  # the `GRID` parameters fitted
    points: int  # grid points searched
    params: dict[str, float]  # `Efficiency.calibrated` arguments at the best point
    before: list[float]  # each run's signed error (%) at the start
    after: list[float]  # at the best point
    held_out: np.ndarray | None  # `FOLDS`-fold, where there are enough runs
    loso: np.ndarray  # leave-one-source-out


def start_params(base: Efficiency) -> dict[str, float]:
    """The `Efficiency.calibrated` arguments that leave ``base`` as it is: where a fit starts.

    >>> start_params(Efficiency(flash_attention=0.5))["flash_attention"]
    0.5
    """
    return {"matmul_scale": 1.0, "matmul_knee": 1.0, "flash_attention": base.flash_attention, "hbm": base.hbm,
            "overlap_slowdown": base.overlap_slowdown}


def fit_hardware(rows: list[dict[str, str]], start: dict[str, float], free: list[str], single_source: list[float] | None) -> HardwareFit:
    """Fit the ``free`` parameters from ``start`` over the published ``rows`` of one hardware type; a
    source alone on it is held out by ``single_source`` (each row's error), or else by ``start``."""
    points = grid_points(start, free)
    table = error_table(rows, points)
    params = points[best_point(table, list(range(len(rows))))]
    before, after = errors_pct(rows, start), errors_pct(rows, params)
    sources = [source_family(r) for r in rows]
    fallback = single_source if single_source is not None and len(set(sources)) == 1 else before
    return HardwareFit(free=free, points=len(points), params=params, before=before, after=after,
                       held_out=cross_validated(table) if len(rows) >= 2 * FOLDS else None,
                       loso=leave_one_source_out(table, sources, fallback))


def read_runs(path: Path) -> list[dict[str, str]]:
    """The published runs of ``path`` (`DEFAULT_DATA`'s columns)."""
    with path.open() as f:
        return list(csv.DictReader(f))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--hardware", action="append", help="fit only this hardware type (repeatable; default all)")
    parser.add_argument("--measured", type=Path, action="append",
                        help="a benchmarks.gpu_truth CSV (repeatable): fit its profile's efficiencies to its micro-benchmarks instead")
    parser.add_argument("--profile-dir", type=Path, default=PROFILE_DIR,
                        help="where --measured writes its profile (default benchmarks/data/gpu/profiles)")
    parser.add_argument("--out", type=Path, help="the CSV written (default benchmarks/out/calibration.csv, with --measured "
                                                 "benchmarks/out/calibration_measured.csv)")
    args = parser.parse_args(argv)
    if args.measured:
        try:
            return calibrate_measured(args.measured, read_runs(args.data), args.profile_dir,
                                      args.out or Path("benchmarks/out/calibration_measured.csv"))
        except InvalidConfigError as err:  # a CSV that cannot be fitted: say why, no traceback
            print(f"error: {err}", file=sys.stderr)
            return 2
    out = args.out or Path("benchmarks/out/calibration.csv")
    all_rows = read_runs(args.data)
    by_type: dict[str, list[dict[str, str]]] = defaultdict(list)
    for row in all_rows:
        by_type[hardware_type(row)].append(row)
    results, loso_all = [], []
    for hardware, rows in sorted(by_type.items()):
        if args.hardware and hardware not in args.hardware:
            continue
        start = start_params(microbenchmark_efficiency(hardware))
        sources = {source_family(r) for r in rows}
        # Only a type with one source falls back, on what other parts of its chip teach.
        fit = fit_hardware(rows, start, free_parameters(len(rows)), chip_transfer_pct(rows, all_rows) if len(sources) == 1 else None)
        params, before, after, held_out, loso = fit.params, fit.before, fit.after, fit.held_out, fit.loso
        loso_all += list(loso)
        print(f"{hardware}: {len(rows)} runs, free {fit.free}, {fit.points} grid points")
        print(f"  mean |error| micro-benchmark efficiencies {_mean_abs(before):.2f} %, calibrated {_mean_abs(after):.2f} % "
              f"(max {max(map(abs, after)):.2f} %)")
        if held_out is not None:
            print(f"  {FOLDS}-fold held-out mean |error| {_mean_abs(held_out):.2f} % (max {np.abs(held_out).max():.2f} %)")
        print(f"  leave-one-source-out mean |error| {_mean_abs(loso):.2f} % (max {np.abs(loso).max():.2f} %)")
        fitted = microbenchmark_efficiency(hardware).calibrated(**params)
        _print_physical(fitted)
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
    write_csv(out, results)
    print(f"wrote {out}")
    return 0


def _print_physical(fitted: Efficiency) -> None:
    for name, (value, inside) in physical_check(fitted).items():
        low, high = PHYSICAL_RANGE[name]
        print(f"  {name} {value:.3f} {'inside' if inside else 'OUTSIDE'} [{low}, {high}]")


def measured_grid(base: Efficiency) -> dict[str, list[float]]:
    """The candidates a measured fit searches: `PHYSICAL_RANGE` in steps of 0.01 (the GEMM scale as
    multiples of ``base``'s large-GEMM efficiency), the GEMM curve's bend over `GRID`'s.

    >>> grid = measured_grid(Efficiency(matmul_curve=((1e12, 0.5),)))
    >>> grid["hbm"][0], grid["hbm"][-1], grid["matmul_scale"][0], grid["matmul_scale"][-1]
    (0.5, 0.92, 1.1, 1.8)
    """
    def steps(low: float, high: float) -> list[float]:
        return [round(low + 0.01 * i, 2) for i in range(round((high - low) / 0.01) + 1)]

    top = base.matmul_curve[-1][1]
    return {"hbm": steps(*PHYSICAL_RANGE["hbm"]), "flash_attention": steps(*PHYSICAL_RANGE["flash_attention"]),
            "matmul_scale": [round(v / top, 6) for v in steps(*PHYSICAL_RANGE["large_gemm"])], "matmul_knee": GRID["matmul_knee"]}


def _published_summary(label: str, errors: list[float], held_out: np.ndarray) -> dict[str, object]:
    return {"efficiencies": label, "mean |error| %": _mean_abs(errors), "max |error| %": max(map(abs, errors)),
            "leave-one-source-out mean %": _mean_abs(held_out), "leave-one-source-out max %": float(np.abs(held_out).max())}


def _comparison_columns(summary: list[dict[str, object]] | None) -> dict[str, object]:
    """The published-runs comparison as CSV columns (blank without published runs), the same for every hardware."""
    names = {"mean_abs_err_pct": "mean |error| %", "max_abs_err_pct": "max |error| %",
             "loso_mean_abs_err_pct": "leave-one-source-out mean %", "loso_max_abs_err_pct": "leave-one-source-out max %"}
    return {f"{prefix}_{column}": round(float(s[name]), 2) if s else "" for prefix, s in zip(("published", "measured"), summary or [{}, {}])
            for column, name in names.items()}


def calibrate_measured(paths: list[Path], all_rows: list[dict[str, str]], profile_dir: Path, out: Path) -> int:
    """Fit each measured profile to its rows (`benchmarks.calibrate_measured`), report the published
    runs of its hardware type before (the published-figures fit) and after (the measured
    efficiencies, `GRID`'s other free parameters fitted as before), and write the measured profile."""
    measured = read_measured(paths)
    if not measured:
        raise InvalidConfigError(f"no measured micro-benchmark rows in {', '.join(map(str, paths))}",
                                 fix="pass a CSV of python -m benchmarks.gpu_truth that measured gemm, attention, hbm or elementwise cases")
    results = []
    for hardware in dict.fromkeys(r.hardware for r in measured):
        cluster = load_hardware(hardware)
        base = microbenchmark_efficiency(hardware)
        start = start_params(base)
        fit = fit_measured([r for r in measured if r.hardware == hardware], cluster, base=base, start=start, grid=measured_grid(base))
        print(f"{hardware}: measured in {', '.join(fit.csvs)}")
        if fit.unmatched:
            print(f"  {len(fit.unmatched)} rows no case of today's gpu_truth builds, left out: {'; '.join(fit.unmatched[:3])}")
        if fit.stale:
            print(f"  {fit.stale} rows were predicted by another version of the cost model: the fit uses today's predictions")
        print_table(f"{hardware}: micro-benchmarks, mean |error| of predicted vs measured", [
            {"rows": g.name, "n": g.rows, "fitted": ", ".join(f"{k} {v:g}" for k, v in g.values.items()) if g.rows else "not measured",
             "at the range's edge": ", ".join(g.at_edge), f"{hardware} %": "" if g.before_pct is None else g.before_pct,
             "fitted %": "" if g.after_pct is None else g.after_pct} for g in fit.groups])
        if not fit.pinned:
            print(f"  no row measures an efficiency of {hardware}: no profile written")
            continue
        if fit.fp8_before_pct is not None:
            print(f"  fp8 GEMMs (not fitted, on the same curve): mean |error| {fit.fp8_before_pct:.2f} % -> {fit.fp8_after_pct:.2f} %")
        typed = [r for r in all_rows if hardware_type(r) == hardware]
        params, summary = {**start, **fit.params}, None
        if typed:
            free = free_parameters(len(typed))
            sources = {source_family(r) for r in typed}
            published = fit_hardware(typed, start, free, chip_transfer_pct(typed, all_rows) if len(sources) == 1 else None)
            after = fit_hardware(typed, params, [p for p in free if p not in fit.pinned], None)
            params = after.params
            summary = [_published_summary("published-figures fit", published.after, published.loso),
                       _published_summary("measured", after.after, after.loso)]
            print_table(f"{hardware}: {len(typed)} published runs (benchmarks.simulator_accuracy), measured efficiencies for "
                        f"{', '.join(fit.pinned) or 'nothing'}, {', '.join(after.free) or 'nothing else'} fitted to the runs", summary)
        else:
            print(f"  no published runs on {hardware}: nothing to compare on")
        efficiency = base.calibrated(**params)
        _print_physical(efficiency)
        path = write_profile(measured_profile(cluster, efficiency, fit.csvs), profile_dir)
        print(f"  wrote {path} (--hardware {path})")
        results.append({"hardware": hardware, "csvs": " ".join(fit.csvs), **{k: round(v, 3) for k, v in params.items()},
                        **_comparison_columns(summary), "profile": str(path)})
    write_csv(out, results)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
