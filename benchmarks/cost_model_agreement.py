"""The op-level cost model the intra-op planners optimise against the layer-level step simulator.

    python -m benchmarks.cost_model_agreement [--only NAME ...] [--ilp-limit-s 30] [--out-dir benchmarks/out]

Both predict the same program: the reference training step of a layout's largest pipeline
stage on one micro-batch per data-parallel replica (`planner.intraop.stage.stage_graph`, with
materialized attention). The op-level model costs it at the layout's rule-based
(Megatron) shardings (`planner.intraop.rule_based`) and at the ILP's own optimum; the simulator
(`planner.intraop.stage.stage_estimate`) costs the layout. Per case the table gives both
op-level times, the simulated one, their ratio, and each split into matmul (the
simulator: GEMMs and attention, recompute included), memory-bound kernels (with the
optimizer update) and exposed communication. Writes ``cost_model_agreement.csv``; the
last line is "N/M layouts agree within 10 %".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import jax
from jax.sharding import PartitionSpec
from pydantic import BaseModel, ConfigDict, Field

from benchmarks.output import print_table, write_csv
from costmodel.errors import InfeasibleError
from costmodel.hardware.machine import machine_for
from costmodel.hardware.registry import load_hardware
from costmodel.inputs.layout import Layout
from costmodel.inputs.stack import stack_with
from costmodel.oplevel.op_time import op_time_breakdown
from costmodel.oplevel.strategy_space import build_space, prune_dominated
from planner.api import layout_plan
from planner.intraop.ilp import solve_intra_op
from planner.intraop.rule_based import rule_based_space
from planner.intraop.stage import intra_op_axes, stage_estimate, stage_graph, train_step_memory_factor
from planner.request import PlanRequest
from validate.lowering import input_specs

AGREE_WITHIN = 0.10
# The rule-based layout is costed whether or not the op-level memory model fits it.
_ANY_MEMORY_BYTES = 2.0**50
# The reference program the intra-op planners shard materializes attention scores, and its
# gradients are reduced where XLA puts them (`validate.intraop_program` pins every equation; the
# per-replica region of `validate.data_parallel_region` is the layout planner's lowering).
_STACK = stack_with("jax", attention="materialized", manual_data_parallel=False)


class Case(BaseModel):
    """One layout of one model on one cluster."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Short label.")
    model: str = Field(description="Preset name.")
    hardware: str = Field(description="Hardware profile.")
    layout: Layout = Field(description="Degrees, micro-batch, recompute, ZeRO (the stack is set to `_STACK`).")
    mesh: str | None = Field(None, description="Mesh; default one axis per parallelism.")
    seq_len: int = Field(2048, description="Sequence length.")
    global_batch: int = Field(256, description="Sequences per step.")


def _layout(**knobs: Any) -> Layout:
    return Layout(stack=_STACK, **knobs)


CASES = (
    Case(name="gpt2-dp8", model="gpt2", hardware="a100-80gb", layout=_layout(dp=8, micro_batch=8), seq_len=1024, global_batch=64),
    Case(name="gpt2-medium-tp4", model="gpt2-medium", hardware="a100-80gb", layout=_layout(dp=2, tp=4, micro_batch=4),
         seq_len=1024, global_batch=32),
    Case(name="llama2-7b-tp2-sel", model="llama2-7b", hardware="h100-sxm",
         layout=_layout(dp=4, tp=2, micro_batch=2, recompute="selective")),
    Case(name="llama3-8b-fsdp8", model="llama3-8b", hardware="h100-sxm",
         layout=_layout(dp=8, micro_batch=2, recompute="full", zero_stage=3)),
    Case(name="llama3-8b-tp4", model="llama3-8b", hardware="h100-sxm", layout=_layout(dp=2, tp=4, micro_batch=2, recompute="full")),
    Case(name="llama3-8b-pp2", model="llama3-8b", hardware="h100-sxm",
         layout=_layout(dp=2, tp=2, pp=2, micro_batch=2, recompute="full")),
    Case(name="llama3-8b-zero1-mb4", model="llama3-8b", hardware="a100-80gb",
         layout=_layout(dp=8, micro_batch=4, recompute="full", zero_stage=1)),
    # The example of issue 17: `plan --model llama3-70b --mesh 8x4 --planner ilp` picks this layout.
    Case(name="llama3-70b-fsdp32", model="llama3-70b", hardware="h100-sxm", mesh="8x4",
         layout=_layout(dp=32, micro_batch=4, recompute="full", zero_stage=3)),
    Case(name="llama2-70b-tp8", model="llama2-70b", hardware="h100-sxm",
         layout=_layout(dp=4, tp=8, micro_batch=1, recompute="full", zero_stage=1)),
    Case(name="mixtral-tp8", model="mixtral-8x7b", hardware="h100-sxm",
         layout=_layout(dp=4, tp=8, micro_batch=1, recompute="full", zero_stage=1)),
)


def run_case(case: Case, *, ilp_limit_s: float = 30.0) -> dict[str, Any]:
    """One table row: the case's op-level times (rule-based and ILP), the simulated one, and their parts."""
    request = PlanRequest(model=case.model, mesh=case.mesh, hardware=case.hardware, seq_len=case.seq_len, global_batch=case.global_batch)
    plan = layout_plan(request, case.layout)
    cfg, train, lay = plan.model, plan.train, plan.layout
    machine = machine_for(load_hardware(case.hardware), compute_dtype=train.compute_dtype.value)
    graph, _ = stage_graph(cfg, train, lay)
    space = build_space(graph, machine.mesh_groups(intra_op_axes(plan.mesh)), machine, memory_factor=train_step_memory_factor)
    specs = {jax.tree_util.keystr(path): spec for path, spec in
             jax.tree_util.tree_flatten_with_path(input_specs(plan), is_leaf=lambda x: isinstance(x, PartitionSpec))[0]}
    megatron = rule_based_space(graph, space, specs, batch=[k for k in specs if k.startswith("[2]")],
                                data_axes=plan.axes_of("dp"), tensor_axes=plan.axes_of("tp"))
    rule = solve_intra_op(megatron, memory_budget_bytes=_ANY_MEMORY_BYTES, time_limit_s=ilp_limit_s)
    parts = op_time_breakdown(graph, megatron, rule.choice)
    try:
        ilp_s: float | str = solve_intra_op(prune_dominated(space), memory_budget_bytes=machine.hbm_bytes,
                                            time_limit_s=ilp_limit_s).objective_s
    except InfeasibleError:
        ilp_s = "does not fit"
    est = stage_estimate(cfg, train, lay, machine)
    sim = est.breakdown
    ratio = rule.objective_s / est.step_time_s
    return {
        "case": case.name, "layout": f"dp{lay.dp} tp{lay.tp} pp{lay.pp} mb{lay.micro_batch} {lay.recompute.value} zero{lay.zero_stage}",
        "op_rule_based_s": rule.objective_s, "op_ilp_s": ilp_s, "simulated_s": est.step_time_s, "ratio": round(ratio, 3),
        "op_matmul_s": parts.matmul_s, "sim_compute_s": sim.compute_s + sim.recompute_s,
        "op_memory_s": parts.memory_s, "sim_memory_s": sim.memory_bound_s + sim.optimizer_s,
        "op_comm_s": parts.collective_s + parts.reshard_s, "sim_comm_s": sim.exposed_comm_s,
        "agree": "yes" if abs(ratio - 1) <= AGREE_WITHIN else "no",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="case names to run")
    parser.add_argument("--ilp-limit-s", type=float, default=30.0)
    parser.add_argument("--out-dir", type=Path, default=Path("benchmarks/out"))
    args = parser.parse_args(argv)
    cases = [c for c in CASES if args.only is None or c.name in args.only]
    rows = [run_case(c, ilp_limit_s=args.ilp_limit_s) for c in cases]
    print_table("Op-level cost (rule-based shardings, ILP optimum) vs the simulator, one micro-batch step of the largest stage", rows)
    write_csv(args.out_dir / "cost_model_agreement.csv", rows)
    agreeing = sum(r["agree"] == "yes" for r in rows)
    print(f"{agreeing}/{len(rows)} layouts agree within {AGREE_WITHIN:.0%}".replace("%", " %"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
