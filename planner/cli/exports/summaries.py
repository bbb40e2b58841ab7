"""Stack-neutral exports of a `Plan`: Flax-style logical axis rules and a Markdown report.

>>> from planner.api import plan
>>> markdown_report(plan("gpt2", mesh="data=4", hardware="h100-sxm", global_batch=8)).splitlines()[0]
'# Plan: gpt2 on 4× h100-sxm'
"""

from __future__ import annotations

from planner.mesh_assign import KINDS
from planner.plan_schema import Plan
from planner.shardings import logical_rules

_GIB = 2**30


def flax_logical_rules(plan: Plan) -> list[tuple[str, tuple[str, ...] | None]]:
    """``[(logical axis, mesh axes or None), ...]`` as Flax's ``logical_axis_rules`` takes them.

    Mesh axes are the plan's own (``plan.mesh`` names); logical names are the reference
    model's (`planner.programs.params.LogicalAxis`): use them with ``nn.with_logical_partitioning``.
    """
    axes = {k: plan.axes_of(k) for k in KINDS}
    rules = logical_rules(plan.layout, axes, plan.model)
    return [(str(name), mesh_axes or None) for name, mesh_axes in rules.items()]


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
            ("pipeline bubble", b.bubble_s), ("exposed communication", b.exposed_comm_s), ("optimizer", b.optimizer_s),
            *((("offload: exposed device-host copies", b.offload_transfer_s), ("offload: CPU Adam", b.cpu_optimizer_s))
              if b.offload else ()))),
        "",
        "| memory per device | GiB |", "|---|---|",
        *(f"| {name} | {value / _GIB:.2f} |" for name, value in (
            ("parameters", mem.params_bytes), ("gradients", mem.grads_bytes), ("optimizer state", mem.optimizer_bytes),
            ("activations", mem.activations_bytes), ("temporary", mem.temporary_bytes), ("total", mem.total_bytes),
            *((("host (offloaded optimizer state)", mem.host_bytes),) if mem.host else ()))),
        "",
        "| alternative | step time (s) | why not |", "|---|---|---|",
        *(f"| {a.layout.degrees_text} mb{a.layout.micro_batch} {a.layout.recompute} "
          f"z{a.layout.zero_stage} | {a.step_time_s:.3f} | {a.why} |" for a in plan.alternatives),
    ]
    return "\n".join(lines) + "\n"
