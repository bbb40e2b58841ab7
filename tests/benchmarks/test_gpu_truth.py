"""Tests `benchmarks/gpu_truth` (the prepared GPU run) on its CPU path, and the carry script's dry run."""

import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_truth.cli import all_cases, parse_args
from benchmarks.gpu_truth.report import COLUMNS, step_summary
from benchmarks.gpu_truth.target import detect_target
from benchmarks.gpu_truth.timing import KINDS, Case, run_cases

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.jax
def test_cpu_quick_run_writes_one_csv_with_every_kind(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, not an emulated mesh
    command = [sys.executable, "-m", "benchmarks.gpu_truth", "--backend", "cpu", "--quick", "--profile", "--out-dir", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    [path] = [p for p in tmp_path.glob("cpu_*.csv") if not p.stem.endswith("_profile")]
    [profile] = tmp_path.glob("cpu_*_profile.csv")
    profiled = list(csv.DictReader(profile.open()))
    assert {r["model"] for r in profiled} >= {"toy", "toy-wide"} and not any(r["error"] for r in profiled)
    assert any(r["model"].startswith("toy decode") and r["category"] == "every kernel" for r in profiled)
    assert sum(float(r["measured_s"]) for r in profiled if r["category"] in ("gemm", "elementwise")) > 0
    rows = list(csv.DictReader(path.open()))
    assert tuple(rows[0]) == COLUMNS
    assert {r["kind"] for r in rows} == set(KINDS)
    for r in rows:
        assert r["error"] == "", r
        assert r["backend"] == "cpu" and r["jax_version"]
        predicted, measured = float(r["predicted_s"]), float(r["measured_s"])
        assert math.isfinite(predicted) and predicted > 0 and math.isfinite(measured) and measured > 0, r
    assert "planner's choice measured" in done.stdout and "measured order:" in done.stdout


@pytest.mark.jax
def test_only_the_named_kinds_are_run() -> None:
    target = detect_target("cpu", quick=True)
    cases = all_cases(target, ["step", "decode"])
    assert cases and {c.kind for c in cases} == {"step", "decode"}
    assert {c.kind for c in all_cases(target)} == set(KINDS) and parse_args(["--only", "hbm"]).only == ["hbm"]


def test_a_failing_case_is_recorded_and_the_run_goes_on() -> None:
    def fail() -> float:
        raise RuntimeError("cuDNN does not support this shape\nmore detail")

    ok = Case(kind="hbm", name="ok", shape="", dtype="f", predict=lambda: 1.0, measure=lambda: 2.0)
    bad = Case(kind="attention", name="bad", shape="", dtype="f", predict=lambda: 1.0, measure=fail)
    rows = run_cases([bad, ok], budget_s=60)
    assert rows[0].measured_s is None and rows[0].error == "RuntimeError: cuDNN does not support this shape"
    assert rows[1].ratio == 2.0


def test_cases_past_the_budget_are_skipped_with_their_prediction() -> None:
    rows = run_cases([Case(kind="hbm", name="n", shape="", dtype="f", predict=lambda: 1.0, measure=lambda: 1.0)], budget_s=-1)
    assert rows[0].predicted_s == 1.0 and rows[0].measured_s is None and rows[0].error.startswith("skipped")
    assert step_summary(rows) == []


def test_carry_dry_run_lists_the_wheels_for_python_312() -> None:
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_truth_carry.sh"), "--dry-run"], capture_output=True, text=True,
                          timeout=180)
    if done.returncode != 0 and any(s in done.stderr for s in ("Could not find", "No matching distribution", "connection", "Network")):
        pytest.skip(f"the package index cannot be reached: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr[-2000:]
    wheels = [line for line in done.stdout.splitlines() if line.endswith(".whl")]
    names = {w.split("-")[0].lower() for w in wheels}
    assert {"pydantic", "pydantic_core", "ortools", "protobuf", "absl_py", "immutabledict"} <= names
    assert all("cp312" in w or "py3-none" in w or "abi3" in w for w in wheels)
    command = done.stdout.strip().splitlines()[-1]
    assert command.endswith("python -m benchmarks.gpu_truth --backend gpu") and len(command) < 2000
