"""Efficiencies from measurements: a hardware profile refitted to a `benchmarks.gpu_truth` run's micro-benchmarks.

Three of a profile's efficiencies are what micro-benchmarks measure directly, each fitted to
the rows of one group (`GROUPS`), in this order:

- ``hbm``: the HBM efficiency, from the ``hbm`` rows (a copy) and the ``elementwise`` ones (the
  RMSNorm and SwiGLU XLA fuses);
- ``gemm``: the GEMM efficiency curve's scale and bend (``matmul_scale``, ``matmul_knee``), from
  the ``gemm`` rows in the compute dtype (the fp8 rows are reported, not fitted: a profile has
  one curve, fp8 GEMMs run on it at their own peak);
- ``attention``: the fused-attention efficiency, from the ``attention`` rows of the fused kernel
  (cuDNN's on a GPU; the reference program's blockwise kernel is no kernel the profile describes).

Each is the candidate (the caller's grid: `benchmarks.calibrate` gives its physical ranges)
with the least mean |error| of predicted against measured seconds over the rows it moves (a row
whose prediction the parameter leaves unchanged says nothing about it). The predictions are
the run's own cases (`benchmarks.gpu_truth.micro`) rebuilt on the profile with the candidate
efficiencies, so what a row predicts has one source of truth. Rows measured on the CPU are not
fitted: the ``cpu`` profile is measured by `validate.cpu_profile` itself.

>>> measured_name("h100-sxm")
'h100-sxm-measured'
"""

from __future__ import annotations

import csv
import itertools
import statistics
from pathlib import Path
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field

from benchmarks.gpu_truth.micro import attention_cases, elementwise_cases, gemm_cases, hbm_cases
from benchmarks.gpu_truth.sizes import sizes_for
from benchmarks.gpu_truth.target import Target
from benchmarks.gpu_truth.timing import Case
from costmodel.errors import InvalidConfigError
from costmodel.hardware.profile import ClusterSpec
from costmodel.step.roofline import Efficiency

# A row's identity in a run: (kind, case, shape, dtype), as `benchmarks.gpu_truth.report` writes it.
Key = tuple[str, str, str, str]
MICRO_KINDS = ("gemm", "attention", "hbm", "elementwise")


class MeasuredRow(BaseModel):
    """One measured micro-benchmark row of a `benchmarks.gpu_truth` CSV."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    csv: str = Field(description="The CSV's file name.")
    backend: str = Field(description="gpu or cpu.")
    hardware: str = Field(description="The profile that predicted it.")
    kind: str = Field(description="gemm, attention, hbm or elementwise.")
    case: str = Field(description="What ran.")
    shape: str = Field(description="Its sizes.")
    dtype: str = Field(description="Its dtype.")
    predicted_s: float = Field(description="Seconds the CSV's run predicted.")
    measured_s: float = Field(gt=0, description="Seconds measured.")

    @property
    def key(self) -> Key:
        return (self.kind, self.case, self.shape, self.dtype)


class Group(BaseModel):
    """The efficiencies one kind of row pins, and which rows those are."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="hbm, gemm or attention.")
    params: tuple[str, ...] = Field(description="The `Efficiency.calibrated` arguments it fits; the first one decides which rows it moves.")
    selects: Callable[[MeasuredRow, Target], bool] = Field(description="Whether a row belongs to the group.")


GROUPS = (
    Group(name="hbm", params=("hbm",), selects=lambda row, target: row.kind in ("hbm", "elementwise")),
    Group(name="gemm", params=("matmul_scale", "matmul_knee"),
          selects=lambda row, target: row.kind == "gemm" and row.dtype == target.dtype),
    Group(name="attention", params=("flash_attention",),
          selects=lambda row, target: row.kind == "attention" and row.case.startswith(f"{target.attention_implementation} ")),
)


class GroupFit(BaseModel):
    """One group's fit: its rows, its values, and the error before and after."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="hbm, gemm or attention.")
    rows: int = Field(description="Rows the group's parameters move (0: nothing fitted, the start values kept).")
    values: dict[str, float] = Field(description="The fitted `Efficiency.calibrated` arguments.")
    at_edge: tuple[str, ...] = Field(description="Parameters at the first or last candidate: the truth may lie beyond.")
    before_pct: float | None = Field(description="Mean |error| (% of measured) at the profile's own efficiencies.")
    after_pct: float | None = Field(description="Mean |error| at the fitted ones.")


class MeasuredFit(BaseModel):
    """A hardware profile's efficiencies fitted to its measured rows."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hardware: str = Field(description="The catalog profile the rows were predicted with.")
    csvs: tuple[str, ...] = Field(description="The CSVs the rows come from.")
    params: dict[str, float] = Field(
        description="`Efficiency.calibrated` arguments: the fitted ones, the start's where nothing was measured.")
    pinned: tuple[str, ...] = Field(description="The parameters the measurements fitted.")
    groups: tuple[GroupFit, ...] = Field(description="Each group's fit, in `GROUPS` order.")
    fp8_before_pct: float | None = Field(description="Mean |error| of the fp8 GEMM rows at the profile's own efficiencies (None: none).")
    fp8_after_pct: float | None = Field(description="The same at the fitted ones.")
    unmatched: tuple[str, ...] = Field(description="Rows no case of today's gpu_truth builds (left out).")
    stale: int = Field(description="Rows whose CSV prediction differs from today's at the same profile (the fit uses today's).")


def measured_name(hardware: str) -> str:
    """The name of the profile fitted to ``hardware``'s measurements."""
    return f"{hardware}-measured"


def read_measured(paths: list[Path]) -> list[MeasuredRow]:
    """The measured micro-benchmark rows of the CSVs ``paths``; rows without a measurement are left out.

    Raises:
      InvalidConfigError: a file that is not a `benchmarks.gpu_truth` CSV.
    """
    rows = []
    for path in paths:
        with path.open() as f:
            reader = csv.DictReader(f)
            if not {"backend", "hardware", "kind", "case", "shape", "dtype", "predicted_s", "measured_s"} <= set(reader.fieldnames or ()):
                raise InvalidConfigError(f"{path}: not a benchmarks.gpu_truth CSV",
                                         fix="pass the CSVs python -m benchmarks.gpu_truth writes")
            rows += [MeasuredRow(csv=path.name, **{k: r[k] for k in ("backend", "hardware", "kind", "case", "shape", "dtype")},
                                 predicted_s=float(r["predicted_s"]), measured_s=float(r["measured_s"]))
                     for r in reader if r["kind"] in MICRO_KINDS and r["predicted_s"] and r["measured_s"] and not r["error"]]
    return rows


def with_efficiency(cluster: ClusterSpec, efficiency: Efficiency) -> ClusterSpec:
    """``cluster`` whose device has ``efficiency``."""
    return cluster.model_copy(update={"device": cluster.device.model_copy(update={"efficiency": efficiency})})


def target_for(cluster: ClusterSpec, backend: str, *, quick: bool = False) -> Target:
    """A `Target` that predicts as the run did on ``backend`` with ``cluster`` (the device's facts are not needed to predict)."""
    return Target(backend=backend, quick=quick, device="", driver="", jax_version="", cluster=cluster)


def micro_cases(cluster: ClusterSpec, backend: str) -> dict[Key, Case]:
    """Every micro-benchmark case of a full and a ``--quick`` run on ``cluster``, by key."""
    cases: dict[Key, Case] = {}
    for quick in (False, True):
        target, sizes = target_for(cluster, backend, quick=quick), sizes_for(quick=quick)
        for make in (gemm_cases, attention_cases, hbm_cases, elementwise_cases):
            cases |= {(case.kind, case.name, case.shape, case.dtype): case for case in make(target, sizes)}
    return cases


def predictions(rows: list[MeasuredRow], cluster: ClusterSpec, efficiency: Efficiency) -> list[float]:
    """Seconds today's cost model predicts for each row on ``cluster`` with ``efficiency``."""
    cases = micro_cases(with_efficiency(cluster, efficiency), rows[0].backend) if rows else {}
    return [cases[row.key].predict() for row in rows]


def mean_abs_error_pct(predicted: list[float], rows: list[MeasuredRow]) -> float:
    """Mean |predicted − measured| as a percentage of measured.

    >>> row = MeasuredRow(csv="", backend="gpu", hardware="", kind="hbm", case="", shape="", dtype="", predicted_s=1, measured_s=2)
    >>> mean_abs_error_pct([1.0, 3.0], [row, row])
    50.0
    """
    return statistics.mean(100 * abs(p - r.measured_s) / r.measured_s for p, r in zip(predicted, rows))


def _fit_group(group: Group, rows: list[MeasuredRow], cluster: ClusterSpec, base: Efficiency, params: dict[str, float],
               grid: dict[str, list[float]]) -> GroupFit:
    """``group``'s parameters over ``grid``, the others held at ``params``."""
    first = group.params[0]
    low, high = (predictions(rows, cluster, base.calibrated(**{**params, first: grid[first][end]})) for end in (0, -1))
    moved = [row for row, a, b in zip(rows, low, high) if a != b]
    if not moved:
        return GroupFit(name=group.name, rows=0, values={p: params[p] for p in group.params}, at_edge=(), before_pct=None, after_pct=None)
    candidates = [dict(zip(group.params, values)) for values in itertools.product(*(grid[p] for p in group.params))]
    errors = [mean_abs_error_pct(predictions(moved, cluster, base.calibrated(**{**params, **c})), moved) for c in candidates]
    best = candidates[min(range(len(candidates)), key=errors.__getitem__)]
    return GroupFit(name=group.name, rows=len(moved), values=best,
                    at_edge=tuple(p for p in group.params if best[p] in (grid[p][0], grid[p][-1])),
                    before_pct=mean_abs_error_pct(predictions(moved, cluster, cluster.device.efficiency), moved),
                    after_pct=min(errors))


def fit_measured(rows: list[MeasuredRow], cluster: ClusterSpec, *, base: Efficiency, start: dict[str, float],
                 grid: dict[str, list[float]]) -> MeasuredFit:
    """``cluster``'s efficiencies fitted to ``rows`` (all predicted with it): each group's parameters
    in turn, as arguments of ``base.calibrated``, over ``grid``, from ``start``.

    Raises:
      InvalidConfigError: rows of the CPU backend, or of more than one profile.
    """
    if {r.backend for r in rows} != {"gpu"} or len({r.hardware for r in rows}) != 1:
        raise InvalidConfigError("the rows to fit must be measured on a GPU, with one hardware profile",
                                 fix="pass the CSVs of one GPU part (the cpu profile is measured by validate.cpu_profile)")
    target = target_for(cluster, "gpu")
    known = micro_cases(cluster, "gpu")
    unmatched = tuple(f"{r.kind} {r.case} {r.shape} {r.dtype}" for r in rows if r.key not in known)
    rows = [r for r in rows if r.key in known]
    today = predictions(rows, cluster, cluster.device.efficiency)
    stale = sum(1 for p, r in zip(today, rows) if abs(p - r.predicted_s) > 1e-6 * r.predicted_s)
    params, groups = dict(start), []
    for group in GROUPS:
        fitted = _fit_group(group, [r for r in rows if group.selects(r, target)], cluster, base, params, grid)
        params.update(fitted.values)
        groups.append(fitted)
    fp8 = [r for r in rows if r.kind == "gemm" and r.dtype != target.dtype]
    return MeasuredFit(
        hardware=rows[0].hardware if rows else cluster.name, csvs=tuple(dict.fromkeys(r.csv for r in rows)), params=params,
        pinned=tuple(p for g in groups if g.rows for p in g.values), groups=tuple(groups),
        fp8_before_pct=mean_abs_error_pct(predictions(fp8, cluster, cluster.device.efficiency), fp8) if fp8 else None,
        fp8_after_pct=mean_abs_error_pct(predictions(fp8, cluster, base.calibrated(**params)), fp8) if fp8 else None,
        unmatched=unmatched, stale=stale)


def measured_profile(cluster: ClusterSpec, efficiency: Efficiency, csvs: tuple[str, ...]) -> ClusterSpec:
    """``cluster`` renamed `measured_name` with ``efficiency``, its description naming the CSVs it was fitted to."""
    what = f"efficiencies fitted by benchmarks.calibrate --measured to {', '.join(csvs)}"
    device = cluster.device.model_copy(update={"efficiency": efficiency, "source": f"{cluster.device.source}; {what}"})
    description = f"{cluster.name} with its {what} (benchmarks/data/gpu); every other fact as {cluster.name}. {cluster.description}".strip()
    return ClusterSpec.model_validate({**cluster.model_dump(), "name": measured_name(cluster.name), "description": description,
                                       "device": device.model_dump()})


def write_profile(profile: ClusterSpec, directory: Path) -> Path:
    """Write ``profile`` as ``<directory>/<name>.json`` (loadable with ``--hardware PATH``); its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{profile.name}.json"
    path.write_text(profile.model_dump_json(indent=2) + "\n")
    return path
