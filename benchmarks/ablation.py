"""Each mechanism of the step simulator switched off in turn: its effect on the leave-one-source-out error.

    python -m benchmarks.ablation [--out benchmarks/out/ablation.csv]

The development set (the shared published runs and ``benchmarks/data/training_runs.csv``) is
simulated as `benchmarks.simulator_accuracy` simulates it, once with every mechanism on and once
with each one off (`MECHANISMS`: a change to every row's layout or machine, applied after the row's
unstated knobs are tuned), and each time scored leaving one source out, the GEMM scale refitted per
hardware type without the held-out source (`leave_one_source_out_pct`): what a mechanism is worth
when the constants may absorb its absence. The first table gives each mechanism's mean and max
|error| and its change against all on; the second the change of each source's mean |error|
(positive: the source is predicted worse without it). Writes one CSV row per mechanism and source.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from benchmarks.output import print_table, write_csv
from benchmarks.simulator_accuracy import (
    DEFAULT_DATA,
    TRAINING_DATA,
    Variant,
    as_run,
    leave_one_source_out_pct,
    read_rows,
    source_family,
)
from costmodel.hardware.machine import Machine
from costmodel.inputs.layout import Layout
from costmodel.inputs.stack import TpOverlap


class Mechanism(BaseModel):
    """One mechanism of the simulator and how to switch it off."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    name: str = Field(description="Short label.")
    off: str = Field(description="What switching it off does.")
    variant: Variant = Field(description="The change to every row's layout and machine.")


def _stack(**facts: object) -> Variant:
    def variant(layout: Layout, machine: Machine) -> tuple[Layout, Machine]:
        return layout.model_copy(update={"stack": layout.stack.model_copy(update=facts)}), machine
    return variant


def _efficiency(**fields: object) -> Variant:
    def variant(layout: Layout, machine: Machine) -> tuple[Layout, Machine]:
        return layout, machine.model_copy(update={"efficiency": machine.efficiency.model_copy(update=fields)})
    return variant


def _no_latency(layout: Layout, machine: Machine) -> tuple[Layout, Machine]:
    tiers = {name: getattr(machine, name) for name in ("intra", "inter", "intra_pair", "inter_cross_rail")}
    return layout, machine.model_copy(update={name: tier.model_copy(update={"latency_s": 0.0})
                                              for name, tier in tiers.items() if tier is not None})


def _flat_gemm_curve(layout: Layout, machine: Machine) -> tuple[Layout, Machine]:
    best = max(e for _, e in machine.efficiency.matmul_curve)
    return _efficiency(matmul_curve=((1.0, best), (1e15, best)))(layout, machine)


MECHANISMS = (
    Mechanism(name="collective latency", off="every link's per-message latency (α) 0: collectives cost bytes / bandwidth",
              variant=_no_latency),
    Mechanism(name="overlap slowdown", off="compute beside an overlapped collective runs at full speed (NCCL's SMs free)",
              variant=_efficiency(overlap_slowdown=0.0)),
    Mechanism(name="kernel floor", off="no launch and tail latency per kernel", variant=_efficiency(kernel_floor_s=0.0)),
    Mechanism(name="attention length curve", off="fused attention at the calibrated efficiency whatever the sequence length",
              variant=_efficiency(attention_overhead_tokens=None)),
    Mechanism(name="GEMM size curve", off="every GEMM at the part's best matmul efficiency, whatever its size",
              variant=_flat_gemm_curve),
    Mechanism(name="unfused eager kernels", off="every stack fuses elementwise ops and norms (XLA, Inductor)",
              variant=_stack(fused_elementwise=True, fused_norm=True)),
    Mechanism(name="data-parallel overlap", off="no stack overlaps its gradient reduction with the backward",
              variant=_stack(dp_overlap=False)),
    Mechanism(name="tensor-parallel overlap", off="no stack overlaps its tensor-parallel collectives (no async TP, userbuffers)",
              variant=_stack(tp_overlap=TpOverlap.NONE)),
    Mechanism(name="FSDP2 copy-out", off="FSDP2 computes on its all-gather buffer, as FSDP1 does", variant=_stack(fsdp_copy_out=False)),
    Mechanism(name="ZeRO over context ranks", off="ZeRO and FSDP shard over the data ranks alone, beside context parallelism",
              variant=_stack(zero_over_context=False)),
    Mechanism(name="reentrant recompute", off="recompute re-runs only what it dropped, never the whole layer",
              variant=_stack(reentrant_recompute=False)),
    Mechanism(name="pipeline overlap", off="interleaved pipelines block on their sends and reduce gradients after the last stage",
              variant=_stack(overlap_p2p=False, per_chunk_grad_reduce=False)),
)


def ablate(rows: list[dict[str, str]], mechanisms: tuple[Mechanism, ...] = MECHANISMS) -> list[dict[str, object]]:
    """One row per mechanism (and "all on" first) and source: the source's mean |error| (%) left out, and its runs."""
    out = []
    for name, variant in (("all on", as_run), *((m.name, m.variant) for m in mechanisms)):
        errors: dict[str, list[float]] = defaultdict(list)
        for row, err in zip(rows, leave_one_source_out_pct(rows, variant)):
            errors[source_family(row)].append(abs(err))
        out += [{"mechanism": name, "source": source, "runs": len(errs), "mean_abs_err_pct": statistics.mean(errs)}
                for source, errs in sorted(errors.items())]
    return out


def summary(results: list[dict[str, object]], rows: list[dict[str, str]]) -> list[dict[str, object]]:
    """Per mechanism: the run-weighted mean and max of the sources' errors, and the change against all on."""
    by_mechanism: dict[str, list[dict[str, object]]] = defaultdict(list)
    for r in results:
        by_mechanism[r["mechanism"]].append(r)
    mean = {m: sum(r["mean_abs_err_pct"] * r["runs"] for r in rs) / len(rows) for m, rs in by_mechanism.items()}
    off = {m.name: m.off for m in MECHANISMS}
    return [{"mechanism": m, "switched off": off.get(m, "-"), "loso_mean_abs_err_pct": round(v, 2),
             "change_pct_points": round(v - mean["all on"], 2),
             "worst_source_pct": round(max(r["mean_abs_err_pct"] for r in by_mechanism[m]), 2)} for m, v in mean.items()]


def per_source(results: list[dict[str, object]]) -> list[dict[str, object]]:
    """Sources as rows, mechanisms as columns: the change of the source's mean |error| with the mechanism off."""
    base = {r["source"]: r for r in results if r["mechanism"] == "all on"}
    table: dict[str, dict[str, object]] = {s: {"source": s, "runs": r["runs"], "all on": round(r["mean_abs_err_pct"], 1)}
                                           for s, r in base.items()}
    for r in results:
        if r["mechanism"] != "all on":
            table[r["source"]][r["mechanism"]] = round(r["mean_abs_err_pct"] - base[r["source"]]["mean_abs_err_pct"], 1)
    return list(table.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/ablation.csv"))
    args = parser.parse_args(argv)
    rows = [r for path in (DEFAULT_DATA, TRAINING_DATA) if path.exists() for r in read_rows(path)]
    results = ablate(rows)
    print_table(f"Leave-one-source-out |error| with each mechanism off ({len(rows)} development runs)", summary(results, rows))
    print_table("Change of each source's mean |error| (% points) with the mechanism off", per_source(results))
    write_csv(args.out, results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
