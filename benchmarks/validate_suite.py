"""Every plan the planner emits, compiled: plan, then `plan validate --compile-only`, on many cases.

    python -m benchmarks.validate_suite [--only NAME ...]

Each case is what a user types: a model, a mesh, a hardware profile (and a sequence length,
batch or planner), planned by `planner.api.plan` exactly as `plan` plans it, then compiled
on emulated CPU devices (`validate.compile_check.compile_in_subprocess`) and compared item by
item (`validate.report.checks`). Nothing is chosen by hand. The table gives, per case, the
layout the planner chose, the worst ratio of each kind of check (memory per device, memory
arguments, FLOPs, collective bytes), compile time and the compiling process's peak RSS; a
case validates when every check is predicted and within tolerance. Writes
``benchmarks/out/validate_suite.csv``; the last line is "N/M plans validate".
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from benchmarks.output import print_table, write_csv
from costmodel.errors import PlannerError
from costmodel.inputs.stack import stack_with
from costmodel.inputs.train_config import OptimizerState
from costmodel.inputs.workload import WorkloadKind
from planner.api import plan
from planner.request import PlannerName, PlanRequest
from search.pins import LayoutPins
from validate.compile_check import compile_in_subprocess
from validate.report import Check, checks


class Case(BaseModel):
    """One `plan` invocation."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Short label.")
    model: str = Field(description="Preset name or config path.")
    mesh: str | None = Field(description="Mesh, as --mesh takes it; None: the planner shapes one for `devices`.")
    devices: int | None = Field(None, description="Devices, as --devices takes them, where no mesh is given.")
    hardware: str = Field(description="Hardware profile.")
    seq_len: int | None = Field(None, description="Sequence length (the model's default when None).")
    global_batch: int | None = Field(256, description="Sequences per step (None: planned, as `plan` does with no --global-batch).")
    planner: PlannerName = Field(PlannerName.GRID, description="grid, ilp or a search planner.")
    workload: WorkloadKind = Field(WorkloadKind.PRETRAIN, description="--workload.")
    pins: LayoutPins = Field(LayoutPins(), description="--zero, --micro-batch, ... as a user pins them.")
    stack_facts: dict[str, Any] = Field({}, description="Software-fact flags over the jax stack (--cross-entropy-chunks 8, ...).")
    optimizer_state: OptimizerState = Field(OptimizerState.FP32, description="--optimizer-state.")
    optimizer_in_backward: bool = Field(False, description="--optimizer-in-backward.")


CASES = (
    Case(name="readme", model="llama3-8b", mesh="8x4", hardware="h100-sxm", global_batch=None),
    Case(name="gpt2-1dev", model="gpt2", mesh="1", hardware="a100-80gb", global_batch=16, seq_len=1024),
    Case(name="gpt2-xl", model="gpt2-xl", mesh="2x4", hardware="a100-80gb", global_batch=64, seq_len=1024),
    Case(name="gpt2-medium-ilp", model="gpt2-medium", mesh="data=2,tensor=4", hardware="a100-40gb", global_batch=32, seq_len=1024,
         planner="ilp"),
    Case(name="llama3-8b-a100-40", model="llama3-8b", mesh="2x4", hardware="a100-40gb", global_batch=64, seq_len=2048),
    Case(name="llama3-8b-long", model="llama3-8b", mesh="4x2", hardware="h100-sxm", global_batch=16, seq_len=8192),
    Case(name="llama2-13b", model="llama2-13b", mesh="4x4", hardware="a100-80gb", global_batch=128, seq_len=4096),
    Case(name="llama3-70b", model="llama3-70b", mesh="8x4", hardware="h100-sxm", global_batch=128, seq_len=4096),
    Case(name="llama2-13b-pp", model="llama2-13b", mesh="pipeline=4,tensor=2", hardware="a100-40gb", global_batch=32, seq_len=2048),
    Case(name="llama3-70b-tpu", model="llama3-70b", mesh="4x8", hardware="tpu-v5p", global_batch=128, seq_len=4096),
    Case(name="mixtral", model="mixtral-8x7b", mesh="8x4", hardware="h100-sxm", global_batch=128, seq_len=4096),
    Case(name="llama2-7b-tpu-v4", model="llama2-7b", mesh="2x8", hardware="tpu-v4", global_batch=64, seq_len=2048),
    Case(name="llama3-8b-ilp", model="llama3-8b", mesh="data=4,tensor=2", hardware="h100-sxm", global_batch=16, seq_len=1024,
         planner="ilp"),
    # Meshes whose axes are pinned, so the plan must use tensor or pipeline parallelism with what else it picks.
    Case(name="gpt2-xl-pp", model="gpt2-xl", mesh="pipeline=2,data=4", hardware="a100-40gb", global_batch=64, seq_len=1024),
    Case(name="gpt2-medium-tp", model="gpt2-medium", mesh="data=2,tensor=4", hardware="a100-40gb", global_batch=32, seq_len=1024),
    Case(name="llama2-7b-tp", model="llama2-7b", mesh="data=4,tensor=2", hardware="a100-40gb", global_batch=32, seq_len=4096),
    Case(name="llama3-8b-pp-tp", model="llama3-8b", mesh="pipeline=2,tensor=4", hardware="a100-40gb", global_batch=32, seq_len=4096),
    Case(name="llama3-70b-tp", model="llama3-70b", mesh="data=4,tensor=8", hardware="h100-sxm", global_batch=64, seq_len=4096),
    # ZeRO 1 as a user pins it beside a pipeline: each data replica's gradients summed over the split-backward loop and
    # all-reduced once after it (the planner picks ZeRO 3 here unpinned).
    Case(name="llama2-7b-pp-dp-zero1", model="llama2-7b", mesh="pipeline=2,data=4", hardware="a100-80gb", global_batch=32,
         seq_len=4096, pins=LayoutPins(zero_stage=1)),
    # The loss in pieces inside a pipeline, every pipeline group running the head a piece at a time.
    Case(name="llama3-8b-pp-loss-pieces", model="llama3-8b", mesh="pipeline=2,data=4", hardware="h100-sxm", global_batch=64,
         seq_len=4096, pins=LayoutPins(zero_stage=1), stack_facts={"cross_entropy_chunks": 8}),
    # Interleaving as a user asks for it (--interleave 3; without it the planner now runs the split-backward 1F1B here):
    # chunks wrap around the pipeline ring.
    Case(name="gpt2-pp-interleaved", model="gpt2", mesh="pipeline=4,data=2", hardware="a100-40gb", global_batch=64, seq_len=1024,
         pins=LayoutPins(interleave=3)),
    Case(name="mixtral-tp", model="mixtral-8x7b", mesh="data=4,tensor=8", hardware="h100-sxm", global_batch=64, seq_len=4096),
    # Expert parallelism on a mesh's expert axis, and on two GB200 NVL72 racks as `plan --devices 144` chooses it.
    Case(name="mixtral-ep", model="mixtral-8x7b", mesh="data=4,expert=8", hardware="h100-sxm", global_batch=64, seq_len=4096),
    Case(name="mixtral-gb200-ep", model="mixtral-8x7b", mesh="data=9,expert=8,tensor=2", hardware="gb200-nvl72", global_batch=None),
    # Issue 35's must-show: each ZeRO stage pinned, the rest planned.
    *(Case(name=f"llama3-8b-zero{z}", model="llama3-8b", mesh="data=8", hardware="h100-sxm", global_batch=64, seq_len=2048,
           pins=LayoutPins(zero_stage=z, micro_batch=2)) for z in (0, 1, 2, 3)),
    # The same beside tensor axes: each replica's gradients formed on its own devices, reduced as ZeRO needs.
    *(Case(name=f"llama3-8b-tp-zero{z}", model="llama3-8b", mesh="data=2,tensor=4", hardware="h100-sxm", global_batch=32, seq_len=2048,
           pins=LayoutPins(zero_stage=z, micro_batch=2)) for z in (0, 1, 2)),
    # The search planners, and the workloads other than pretraining.
    Case(name="gpt2-medium-anneal", model="gpt2-medium", mesh="data=2,tensor=4", hardware="a100-40gb", global_batch=32, seq_len=1024,
         planner="anneal"),
    Case(name="gpt2-medium-beam", model="gpt2-medium", mesh="data=4,tensor=2", hardware="a100-40gb", global_batch=32, seq_len=1024,
         planner="beam"),
    Case(name="llama3-8b-finetune", model="llama3-8b", mesh="data=8", hardware="a100-80gb", global_batch=64, seq_len=2048,
         workload="finetune-full"),
    Case(name="llama3-8b-lora", model="llama3-8b", mesh="4x2", hardware="a100-40gb", global_batch=32, seq_len=2048,
         workload="finetune-lora"),
    Case(name="llama3-8b-prefill", model="llama3-8b", mesh="4x2", hardware="h100-sxm", global_batch=8, seq_len=4096,
         workload="prefill"),
    Case(name="llama3-70b-decode", model="llama3-70b", mesh="8", hardware="h100-sxm", global_batch=32, seq_len=4096,
         workload="decode"),
    # A mesh the planner shapes: it chooses a 2D weight-stationary split (embed 4 × tensor 8) over 1D tp32.
    Case(name="llama3-405b-decode-2d", model="llama3-405b", mesh=None, devices=32, hardware="tpu-v5p", global_batch=64,
         seq_len=2048, workload="decode"),
    # Options a user passes: the loss in pieces.
    # Pure bf16 (weights, gradients and moments in bf16, no master copy), ZeRO 3 pinned.
    Case(name="llama3-8b-pure-bf16", model="llama3-8b", mesh="data=8", hardware="h100-sxm", global_batch=16, seq_len=2048,
         pins=LayoutPins(zero_stage=3), optimizer_state=OptimizerState.BF16),
    # The optimizer step in backward (torchtune's single-device full fine-tuning default): one
    # 80 GB device, pure bf16; and data=8 with fp32 master weights and ZeRO 1.
    Case(name="llama3-8b-step-in-backward", model="llama3-8b", mesh="1", hardware="h100-sxm", global_batch=2, seq_len=4096,
         workload="finetune-full", pins=LayoutPins(recompute="full"), optimizer_state=OptimizerState.BF16, optimizer_in_backward=True),
    Case(name="llama3-8b-step-in-backward-zero1", model="llama3-8b", mesh="data=8", hardware="h100-sxm", global_batch=8, seq_len=4096,
         workload="finetune-full", pins=LayoutPins(recompute="full", zero_stage=1), optimizer_in_backward=True),
    Case(name="llama3-8b-loss-pieces", model="llama3-8b", mesh="data=8", hardware="h100-sxm", global_batch=16, seq_len=4096,
         stack_facts={"cross_entropy_chunks": 8}),
)


def _worst(found: list[Check], prefix: str) -> tuple[float | None, bool | None]:
    """The ratio furthest from 1 among checks whose item starts with ``prefix``, and whether all hold."""
    rows = [c for c in found if c.item.startswith(prefix)]
    if not rows:
        return None, None
    if any(c.ratio is None for c in rows):
        return None, False
    worst = max(rows, key=lambda c: abs(c.ratio - 1) if c.ratio != float("inf") else float("inf"))
    return worst.ratio, all(c.ok for c in rows)


def run_case(case: Case) -> dict[str, Any]:
    """Plan ``case`` as `plan` does, compile the plan, and summarise the checks."""
    row: dict[str, Any] = {"case": case.name, "model": case.model, "mesh": case.mesh or f"{case.devices} devices",
                           "hardware": case.hardware,
                           "planner": case.planner.value}
    start = time.perf_counter()
    try:
        chosen = plan(PlanRequest(model=case.model, mesh=case.mesh, devices=case.devices, hardware=case.hardware, seq_len=case.seq_len,
                                  global_batch=case.global_batch, planner=case.planner, workload=case.workload, pins=case.pins,
                                  stack=stack_with("jax", **case.stack_facts), optimizer_state=case.optimizer_state,
                                  optimizer_in_backward=case.optimizer_in_backward))
    except PlannerError as err:
        return {**row, "layout": "-", "validates": False, "why": f"planning failed: {err}"}
    plan_s = time.perf_counter() - start
    lay = chosen.layout
    row["layout"] = (f"{lay.degrees_text} mb{lay.micro_batch} {lay.recompute.value} z{lay.zero_stage}"
                     + (f" v{lay.interleave}" if lay.interleave > 1 else "") + (" sp" if lay.sequence_parallel else ""))
    row["plan_s"] = plan_s
    try:
        report = compile_in_subprocess(chosen)
    except PlannerError as err:
        return {**row, "validates": False, "why": f"does not compile: {err}"}
    found = checks(chosen, report)
    for label, prefix in (("memory", "memory per device"), ("arguments", "memory arguments"), ("flops", "flops"),
                          ("collectives", "all-"), ("permutes", "collective-permute")):
        ratio, ok = _worst(found, prefix)
        row[label] = "-" if ratio is None and ok is None else "not predicted" if ratio is None else f"{ratio:.3f}{'' if ok else ' !'}"
    row["compile_s"] = report.compile_time_s
    row["rss_gib"] = report.peak_rss_bytes / 2**30
    hbm = chosen.predicted.memory.hbm_bytes
    row["compiled_gib"] = report.peak_bytes / 2**30
    row["hbm_gib"] = hbm / 2**30 if hbm else float("nan")
    failed = [f"{c.item}{' ' + c.axis if c.axis else ''}" for c in found if c.ok is not True]
    row["validates"] = not failed
    row["why"] = "; ".join(failed)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="case names to run (default: all)")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if not args.only or c.name in args.only]
    rows = []
    for case in cases:
        rows.append(run_case(case))
        print(f"{case.name}: {'validates' if rows[-1]['validates'] else 'does not validate'}", file=sys.stderr, flush=True)
    columns = ("case", "model", "mesh", "hardware", "planner", "layout", "memory", "arguments", "flops", "collectives", "permutes",
               "compiled_gib", "hbm_gib", "plan_s", "compile_s", "rss_gib", "validates", "why")
    table = [{k: r.get(k, "-") for k in columns} for r in rows]
    print_table("planner-chosen plans, compiled on emulated devices (worst ratio per kind; ! = out of tolerance)",
                [{k: v for k, v in r.items() if k != "why"} for r in table])
    for r in table:
        if not r["validates"]:
            print(f"  {r['case']}: {r['why']}")
    write_csv(Path("benchmarks/out/validate_suite.csv"), table)
    passed = sum(r["validates"] for r in rows)
    print(f"{passed}/{len(rows)} plans validate")
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
