"""Exports of a `Plan`: MaxText overrides, Flax-style logical axis rules, a Markdown report.

>>> from planner.api import plan
>>> p = plan("llama3-8b", mesh="data=4,tensor=8", hardware="h100-sxm", global_batch=64)
>>> to_maxtext(p)["ici_tensor_parallelism"]
8
"""

from __future__ import annotations

import math
from typing import Any

from costmodel.errors import InvalidConfigError
from costmodel.inputs.layout import Recompute
from planner.mesh_assign import KINDS
from planner.plan_schema import Plan
from planner.shardings import logical_rules

# MaxText's remat policies (its decoder's get_remat_policy) closest to ours. MaxText always
# checkpoints its layers ("none" means jax.checkpoint with no policy, as "full"); the most it
# saves is "minimal_with_context": every projection, MLP matmul and the attention output,
# recomputing only elementwise work. "minimal" also recomputes the attention core, as
# Megatron's selective recompute does; "save_dot_except_mlpwi" drops the MLP input
# projections, about half the matmul outputs, like torchtitan's per-op policy; torchtitan's
# every-second-layer policy has no counterpart, and "save_dot_except_mlp" keeps about as much.
_MAXTEXT_REMAT = {
    Recompute.NONE: "minimal_with_context", Recompute.SELECTIVE: "minimal", Recompute.SELECTIVE_OP: "save_dot_except_mlpwi",
    Recompute.SELECTIVE_LAYER: "save_dot_except_mlp", Recompute.FULL: "full",
}
# Our parallelism → MaxText's parallelism setting (ici_<name>_parallelism); the mesh axis it
# makes is the same name except pipeline, whose axis MaxText calls "stage".
_MAXTEXT_PARALLELISM = {"dp": "data", "tp": "tensor", "pp": "pipeline", "cp": "context"}
_MAXTEXT_SETTINGS = ("data", "fsdp", "tensor", "pipeline", "context", "expert")
_GIB = 2**30


def flax_logical_rules(plan: Plan) -> list[tuple[str, tuple[str, ...] | None]]:
    """``[(logical axis, mesh axes or None), ...]`` as Flax's ``logical_axis_rules`` takes them.

    Mesh axes are the plan's own (``plan.mesh`` names); logical names are the reference
    model's (`planner.programs.params.LogicalAxis`): use them with ``nn.with_logical_partitioning``.
    """
    axes = {k: plan.axes_of(k) for k in KINDS}
    rules = logical_rules(plan.layout, axes, plan.model)
    return [(str(name), mesh_axes or None) for name, mesh_axes in rules.items()]


def maxtext_degrees(plan: Plan) -> tuple[dict[str, int], dict[str, int]]:
    """(ici, dcn) degree per MaxText parallelism setting: within a node, and across nodes.

    ZeRO 3 data parallelism is MaxText's ``fsdp``; expert parallelism takes its factor out
    of the data axes (MaxText's ``expert`` axis also splits the batch), inside nodes first.
    """
    ici = dict.fromkeys(_MAXTEXT_SETTINGS, 1)
    dcn = dict.fromkeys(_MAXTEXT_SETTINGS, 1)
    lay = plan.layout
    for axis in plan.mesh:
        name = _MAXTEXT_PARALLELISM[axis.parallelism]
        if axis.parallelism == "dp" and lay.zero_stage == 3:
            name = "fsdp"
        ici[name] *= axis.size // axis.nodes_spanned
        dcn[name] *= axis.nodes_spanned
    data = "fsdp" if lay.zero_stage == 3 else "data"
    ep_left = lay.ep
    for degrees in (ici, dcn):
        moved = math.gcd(ep_left, degrees[data])
        degrees[data] //= moved
        degrees["expert"] *= moved
        ep_left //= moved
    if ep_left > 1:
        raise InvalidConfigError(f"expert parallelism {lay.ep} does not divide the data axes of the mesh",
                                 fix="use --format json, or a mesh whose data axes ep divides")
    return ici, dcn


def to_maxtext(plan: Plan) -> dict[str, Any]:
    """MaxText config overrides (``key=value`` for its ``train.py``, or ``**kwargs`` to its pyconfig).

    Only keys MaxText's config knows: ``ici_*``/``dcn_*`` parallelism (an axis's factor inside
    a node is ICI, across nodes DCN; ``num_slices`` is then the node count, which MaxText
    needs for DCN axes), batch and gradient accumulation, sequence length, remat policy,
    ZeRO 1/2 as ``shard_optimizer_over_data``, and the pipeline's micro-batches and layers per
    stage. MaxText's own ``logical_axis_rules`` stay as they are: they map its models' logical
    names (``embed``, ``mlp``, ``heads``, ``kv_heads``, ``vocab``, ``layers``, ``exp``,
    ``activation_batch``, ...) onto its mesh axes, and with every axis this plan leaves out at
    size 1 they shard as the plan does (heads, MLP and vocabulary over tensor, the model
    width over fsdp, layers over stage, experts over expert).

    Raises:
      InvalidConfigError: a layout MaxText cannot express (uneven pipeline stages).
    """
    lay, train = plan.layout, plan.train
    ici, dcn = maxtext_degrees(plan)
    out: dict[str, Any] = {}
    for name in _MAXTEXT_SETTINGS:
        out[f"ici_{name}_parallelism"] = ici[name]
        out[f"dcn_{name}_parallelism"] = dcn[name]
    if math.prod(dcn.values()) > 1:
        out["num_slices"] = math.prod(dcn.values())
    accumulation = lay.micro_batches(train) if lay.pp == 1 else 1
    out["per_device_batch_size"] = train.global_batch / (lay.n_devices * accumulation)
    if accumulation > 1:
        out["gradient_accumulation_steps"] = accumulation
    out["max_target_length"] = train.seq_len
    out["remat_policy"] = _MAXTEXT_REMAT[lay.recompute]
    if lay.zero_stage in (1, 2) and lay.dp > 1:
        out["shard_optimizer_over_data"] = True
    if lay.pp > 1:
        chunks = lay.pp * lay.interleave
        if lay.stage_layers or plan.model.num_layers % chunks:
            raise InvalidConfigError(
                f"MaxText pipelines need equal stages: {plan.model.num_layers} layers over {lay.pp} stages × {lay.interleave} chunks",
                fix="use --format json, or plan with a layer count the stages divide")
        out["num_pipeline_microbatches"] = lay.micro_batches(train)
        out["num_layers_per_pipeline_stage"] = plan.model.num_layers // chunks
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
        *(f"| dp{a.layout.dp} tp{a.layout.tp} pp{a.layout.pp} mb{a.layout.micro_batch} {a.layout.recompute} "
          f"z{a.layout.zero_stage} | {a.step_time_s:.3f} | {a.why} |" for a in plan.alternatives),
    ]
    return "\n".join(lines) + "\n"
