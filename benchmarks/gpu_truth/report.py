"""The run's CSV, its table, and what the full steps say about the planner's choice.

The CSV (one per run, named by profile, device and time) holds a row per case with the facts
that make it comparable later: the device as JAX names it, the NVIDIA driver, the JAX version,
the backend and hardware profile; then the case, its sizes and dtype, predicted and measured
seconds, their ratio, and the error where a value is missing.

>>> csv_name("h100-sxm", "NVIDIA H100 80GB HBM3", datetime(2025, 1, 2, 3, 4))
'h100-sxm_nvidia-h100-80gb-hbm3_2025-01-02T0304.csv'
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks.gpu_truth.steps import CHOICE
from benchmarks.gpu_truth.target import Target
from benchmarks.gpu_truth.timing import Row
from benchmarks.output import print_table, write_csv

COLUMNS = ("device", "driver", "jax_version", "backend", "hardware", "kind", "case", "shape", "dtype", "predicted_s", "measured_s",
           "ratio", "note", "error")


def csv_name(profile: str, device: str, when: datetime) -> str:
    """``<profile>_<device>_<date>T<hhmm>.csv``, the device in lower case with dashes."""
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    return f"{profile}_{slug}_{when:%Y-%m-%dT%H%M}.csv"


def write_variant_csv(name: str, rows: list[dict[str, Any]], device: str, out_dir: Path) -> Path:
    """Write a one-device variant run's ``rows`` (`benchmarks.gpu_truth.decode_layouts`,
    `benchmarks.gpu_truth.accumulate`) as ``<name>_<device>_<time>.csv`` in ``out_dir``; its path."""
    path = out_dir / csv_name(name, device, datetime.now())
    write_csv(path, rows)
    return path


def csv_rows(rows: list[Row], target: Target) -> list[dict[str, Any]]:
    """One dict per row, the `COLUMNS` in order."""
    facts = {"device": target.device, "driver": target.driver, "jax_version": target.jax_version, "backend": target.backend,
             "hardware": target.cluster.name}
    return [{**facts, "kind": r.kind, "case": r.case, "shape": r.shape, "dtype": r.dtype, "predicted_s": r.predicted_s,
             "measured_s": r.measured_s, "ratio": r.ratio, "note": r.note, "error": r.error} for r in rows]


def write_run_csv(rows: list[Row], target: Target, out_dir: Path, *, when: datetime | None = None) -> Path:
    """Write the run's CSV into ``out_dir``; its path."""
    path = out_dir / csv_name(target.cluster.name, target.device, when or datetime.now())
    write_csv(path, csv_rows(rows, target))
    return path


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1e3:.4g}"


def print_rows(rows: list[Row], target: Target, console: Console) -> None:
    """The table of every case: predicted and measured milliseconds, their ratio, the error cut short."""
    table = [{"kind": r.kind, "case": r.case, "shape": r.shape, "dtype": r.dtype, "predicted ms": _ms(r.predicted_s),
              "measured ms": _ms(r.measured_s), "measured/predicted": "" if r.ratio is None else f"{r.ratio:.2f}",
              "error": r.error[:60]} for r in rows]
    print_table(f"Predicted vs measured on {target.device} ({target.cluster.name} profile, jax {target.jax_version})", table,
                console=console)


def step_summary(rows: list[Row]) -> list[str]:
    """Per step model: the planner's choice's error, and the layouts ranked by measured and by predicted time.

    >>> r = lambda note, p, m: Row(kind="step", case=note, shape="", dtype="", predicted_s=p, measured_s=m, group="g", note=note)
    >>> for line in step_summary([r(CHOICE, 1.0, 1.2), r("micro-batch 2", 1.5, 1.1)]): print(line)
    g: planner's choice measured 1.2 s, predicted 1 s (error -16.7 % of measured)
    g: measured order: micro-batch 2 < planner's choice; predicted order: planner's choice < micro-batch 2 (differs)
    """
    lines = []
    for group in dict.fromkeys(r.group for r in rows if r.kind == "step"):
        steps = [r for r in rows if r.kind == "step" and r.group == group]
        choice = next((r for r in steps if r.note == CHOICE), None)
        if choice is None or choice.ratio is None:
            lines.append(f"{group}: the planner's choice was not measured ({choice.error if choice else 'no row'})")
        else:
            error = 100 * (choice.predicted_s - choice.measured_s) / choice.measured_s
            lines.append(f"{group}: planner's choice measured {choice.measured_s:.4g} s, predicted {choice.predicted_s:.4g} s "
                         f"(error {error:+.1f} % of measured)")
        both = [r for r in steps if r.ratio is not None]
        if len(both) >= 2:
            measured = [r.note for r in sorted(both, key=lambda r: r.measured_s)]
            predicted = [r.note for r in sorted(both, key=lambda r: r.predicted_s)]
            lines.append(f"{group}: measured order: {' < '.join(measured)}; predicted order: {' < '.join(predicted)} "
                         f"({'same' if measured == predicted else 'differs'})")
    return lines
