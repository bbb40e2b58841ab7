"""Tests `benchmarks.calibrate --measured` (`benchmarks.calibrate_measured`) on a synthetic gpu_truth run.

The run's "measured" seconds are the cost model's own predictions at known efficiencies, written
by gpu_truth's own CSV writer: the fit must recover those efficiencies exactly.
"""

import csv
import dataclasses
from pathlib import Path

import pytest

from benchmarks.calibrate import main, measured_grid, start_params
from benchmarks.calibrate_measured import fit_measured, micro_cases, read_measured, with_efficiency
from benchmarks.gpu_truth.report import write_run_csv
from benchmarks.gpu_truth.target import Target
from benchmarks.gpu_truth.timing import run_cases
from benchmarks.simulator_accuracy import DEFAULT_DATA, hardware_type, microbenchmark_efficiency
from costmodel.errors import InvalidConfigError
from costmodel.hardware.registry import load_hardware

HARDWARE = "h100-sxm"
BASE = microbenchmark_efficiency(HARDWARE)
GRID = measured_grid(BASE)
# On the grid, inside the physical ranges, away from the catalog's own values (scale 0.70, bend 3, attention 0.35, HBM 0.85).
TRUTH = {"matmul_scale": GRID["matmul_scale"][20], "matmul_knee": 10.0, "flash_attention": 0.52, "hbm": 0.78}


def synthetic_run(directory: Path, truth: dict[str, float], *, backend: str = "gpu") -> Path:
    """A gpu_truth CSV of every micro-benchmark case, "measured" as predicted with ``BASE.calibrated(**truth)``."""
    cluster = load_hardware(HARDWARE, devices_per_node=1)
    efficiency = BASE.calibrated(**{**start_params(BASE), **truth})
    measured = micro_cases(with_efficiency(cluster, efficiency), backend)
    cases = [dataclasses.replace(case, measure=measured[key].predict) for key, case in micro_cases(cluster, backend).items()]
    target = Target(backend=backend, quick=False, device="NVIDIA H100 80GB HBM3", driver="570.0", jax_version="0.11.0", cluster=cluster)
    return write_run_csv(run_cases(cases, budget_s=600), target, directory)


def test_the_fit_recovers_the_efficiencies_that_produced_the_measurements(tmp_path: Path) -> None:
    rows = read_measured([synthetic_run(tmp_path, TRUTH)])
    fit = fit_measured(rows, load_hardware(HARDWARE), base=BASE, start=start_params(BASE), grid=GRID)
    assert {k: fit.params[k] for k in TRUTH} == TRUTH
    assert fit.params["overlap_slowdown"] == BASE.overlap_slowdown  # no micro-benchmark measures it
    assert set(fit.pinned) == set(TRUTH) and fit.stale == 0 and fit.unmatched == ()
    for group in fit.groups:
        assert group.rows > 0 and group.after_pct == pytest.approx(0, abs=1e-9) and group.before_pct > 1, group
        assert group.at_edge == ("matmul_knee",) if group.name == "gemm" else group.at_edge == ()  # 10 is GRID's largest bend
    assert fit.fp8_before_pct is not None and fit.fp8_after_pct == pytest.approx(0, abs=1e-9)  # fp8 runs on the same curve


def test_a_fit_past_the_physical_range_stops_at_its_edge_and_says_so(tmp_path: Path) -> None:
    rows = read_measured([synthetic_run(tmp_path, {**TRUTH, "flash_attention": 0.9})])
    fit = fit_measured(rows, load_hardware(HARDWARE), base=BASE, start=start_params(BASE), grid=GRID)
    attention = next(g for g in fit.groups if g.name == "attention")
    assert attention.values == {"flash_attention": 0.75} and attention.at_edge == ("flash_attention",) and attention.after_pct > 1


def test_rows_measured_on_the_cpu_are_refused(tmp_path: Path) -> None:
    rows = read_measured([synthetic_run(tmp_path, TRUTH, backend="cpu")])
    with pytest.raises(InvalidConfigError, match="measured on a GPU"):
        fit_measured(rows, load_hardware(HARDWARE), base=BASE, start=start_params(BASE), grid=GRID)


def test_calibrate_measured_reports_before_and_after_and_writes_a_loadable_profile(tmp_path: Path, capsys) -> None:
    run = synthetic_run(tmp_path, TRUTH)
    with DEFAULT_DATA.open() as f:
        published = [r for r in csv.DictReader(f) if hardware_type(r) == HARDWARE][:2]  # two runs: the GEMM scale alone is free
    data = tmp_path / "published.csv"
    with data.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(published[0]))
        writer.writeheader()
        writer.writerows(published)
    out, profiles = tmp_path / "calibration_measured.csv", tmp_path / "profiles"
    assert main(["--measured", str(run), "--data", str(data), "--profile-dir", str(profiles), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "published-figures fit" in printed and "measured" in printed and "leave-one-source-out" in printed

    profile = load_hardware(str(profiles / "h100-sxm-measured.json"))
    assert profile.name == "h100-sxm-measured" and run.name in profile.description
    assert profile.device.efficiency == BASE.calibrated(**{**start_params(BASE), **TRUTH})
    catalog = load_hardware(HARDWARE)
    assert profile.device.peak_flops_per_s == catalog.device.peak_flops_per_s and profile.devices_per_node == catalog.devices_per_node
    [row] = list(csv.DictReader(out.open()))
    assert float(row["flash_attention"]) == 0.52 and row["profile"].endswith("h100-sxm-measured.json")
    assert float(row["measured_loso_mean_abs_err_pct"]) == float(row["measured_mean_abs_err_pct"])  # nothing fitted to the runs


def test_without_published_runs_the_profile_is_still_written(tmp_path: Path, capsys) -> None:
    run = synthetic_run(tmp_path, TRUTH)
    data = tmp_path / "no_runs.csv"
    data.write_text(DEFAULT_DATA.open().readline())
    out = tmp_path / "out.csv"
    assert main(["--measured", str(run), "--data", str(data), "--profile-dir", str(tmp_path), "--out", str(out)]) == 0
    assert "no published runs on h100-sxm" in capsys.readouterr().out
    [row] = list(csv.DictReader(out.open()))
    assert row["measured_mean_abs_err_pct"] == "" and load_hardware(row["profile"]).name == "h100-sxm-measured"
