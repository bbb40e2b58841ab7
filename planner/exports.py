"""Exports of a `Plan`: MaxText overrides, Flax-style logical axis rules, a Markdown report.

>>> from planner.api import plan
>>> p = plan("llama3-8b", mesh="data=4,tensor=8", hardware="h100-sxm", global_batch=64)
>>> to_maxtext(p)["ici_tensor_parallelism"]
8
"""

from __future__ import annotations

from typing import Any

from costmodel.layout import Recompute
from planner.mesh_assign import KINDS
from planner.schema import Plan
from planner.shardings import logical_rules

# MaxText's remat policies closest to ours: "minimal" keeps matmul outputs and recomputes
# elementwise work; "save_qkv_proj" also recomputes attention; "full" keeps layer inputs.
_MAXTEXT_REMAT = {
    Recompute.NONE: "minimal", Recompute.SELECTIVE: "save_qkv_proj", Recompute.SELECTIVE_OP: "minimal",
    Recompute.SELECTIVE_LAYER: "save_qkv_proj", Recompute.FULL: "full",
}
_MAXTEXT_AXIS = {"dp": "data", "tp": "tensor", "pp": "pipeline", "cp": "context"}
_GIB = 2**30


def flax_logical_rules(plan: Plan) -> list[tuple[str, tuple[str, ...] | None]]:
    """``[(logical axis, mesh axes or None), ...]`` as Flax's ``logical_axis_rules`` takes them."""
    axes = {k: plan.axes_of(k) for k in KINDS}
    rules = logical_rules(plan.layout, axes, plan.model)
    return [(str(name), mesh_axes or None) for name, mesh_axes in rules.items()]


def to_maxtext(plan: Plan) -> dict[str, Any]:
    """MaxText config overrides: ``ici_*``/``dcn_*`` parallelism per mesh axis, batch, remat.

    An axis's factor inside a node goes to ``ici_*``, its factor across nodes to ``dcn_*``
    (MaxText's between-host/slice mesh); ZeRO 3 data parallelism is MaxText's ``fsdp``.
    """
    out: dict[str, Any] = {}
    for name in ("data", "fsdp", "tensor", "pipeline", "context"):
        out[f"ici_{name}_parallelism"] = 1
        out[f"dcn_{name}_parallelism"] = 1
    for axis in plan.mesh:
        kind = _MAXTEXT_AXIS[axis.parallelism]
        if axis.parallelism == "dp" and plan.layout.zero_stage == 3:
            kind = "fsdp"
        out[f"ici_{kind}_parallelism"] *= axis.size // axis.nodes_spanned
        out[f"dcn_{kind}_parallelism"] *= axis.nodes_spanned
    lay = plan.layout
    out["per_device_batch_size"] = plan.train.global_batch / lay.n_devices
    out["max_target_length"] = plan.train.seq_len
    out["remat_policy"] = _MAXTEXT_REMAT[lay.recompute]
    if lay.pp > 1:
        out["num_pipeline_microbatches"] = lay.micro_batches(plan.train)
    out["logical_axis_rules"] = [[name, list(mesh_axes) if mesh_axes else []] for name, mesh_axes in flax_logical_rules(plan)]
    return out


def markdown_report(plan: Plan) -> str:
    """A Markdown summary of the plan: mesh, prediction with its breakdown, memory, alternatives."""
    est, lay, mem, b = plan.predicted, plan.layout, plan.predicted.memory, plan.predicted.breakdown
    lines = [
        f"# Plan: {plan.model.name} on {lay.n_devices}× {plan.hardware}",
        "",
        "| mesh axis | size | carries | links |", "|---|---|---|---|",
        *(f"| {a.name} | {a.size} | {a.parallelism} | {' + '.join(a.links) or '-'} |" for a in plan.mesh),
        "",
        f"Layout: dp {lay.dp}, tp {lay.tp}, pp {lay.pp} (interleave {lay.interleave}), micro-batch {lay.micro_batch}, "
        f"{lay.recompute} recompute, ZeRO {lay.zero_stage}, sequence parallel {'on' if lay.sequence_parallel else 'off'}.",
        "",
        f"Predicted step time **{est.step_time_s:.3f} s**, MFU {est.mfu:.1%}, {est.tokens_per_s:,.0f} tokens/s.",
        "",
        "| time | seconds |", "|---|---|",
        *(f"| {name} | {value:.3f} |" for name, value in (
            ("compute", b.compute_s), ("memory-bound", b.memory_bound_s), ("recompute", b.recompute_s),
            ("pipeline bubble", b.bubble_s), ("exposed communication", b.exposed_comm_s), ("optimizer", b.optimizer_s))),
        "",
        "| memory per device | GiB |", "|---|---|",
        *(f"| {name} | {value / _GIB:.2f} |" for name, value in (
            ("parameters", mem.params_bytes), ("gradients", mem.grads_bytes), ("optimizer state", mem.optimizer_bytes),
            ("activations", mem.activations_bytes), ("temporary", mem.temporary_bytes), ("total", mem.total_bytes))),
        "",
        "| alternative | step time (s) | why not |", "|---|---|---|",
        *(f"| dp{a.layout.dp} tp{a.layout.tp} pp{a.layout.pp} mb{a.layout.micro_batch} {a.layout.recompute} "
          f"z{a.layout.zero_stage} | {a.step_time_s:.3f} | {a.why} |" for a in plan.alternatives),
    ]
    return "\n".join(lines) + "\n"
