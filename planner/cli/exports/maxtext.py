"""``plan --format maxtext``: MaxText config overrides of a plan made on the ``maxtext`` stack.

>>> from planner.api import plan
>>> p = plan("llama3-8b", mesh="data=4,tensor=8", hardware="h100-sxm", global_batch=64, stack="maxtext")
>>> to_maxtext(p)["ici_tensor_parallelism"]
8
"""

from __future__ import annotations

import math
from typing import Any

from costmodel.errors import InvalidConfigError
from costmodel.inputs.layout import Recompute
from planner.plan_schema import Plan

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
_MAXTEXT_PARALLELISM = {"dp": "data", "tp": "tensor", "pp": "pipeline", "cp": "context", "ep": "expert"}
_MAXTEXT_SETTINGS = ("data", "fsdp", "tensor", "pipeline", "context", "expert")


def maxtext_degrees(plan: Plan) -> tuple[dict[str, int], dict[str, int]]:
    """(ici, dcn) degree per MaxText parallelism setting: within a node, and across nodes.

    ZeRO 3 data parallelism is MaxText's ``fsdp``; the plan's expert axes are MaxText's ``expert``
    (which also splits the batch, as the plan's do).
    """
    ici = dict.fromkeys(_MAXTEXT_SETTINGS, 1)
    dcn = dict.fromkeys(_MAXTEXT_SETTINGS, 1)
    for axis in plan.mesh:
        name = _MAXTEXT_PARALLELISM[axis.parallelism]
        if axis.parallelism == "dp" and plan.layout.zero_stage == 3:
            name = "fsdp"
        if axis.size % axis.nodes_spanned:
            raise InvalidConfigError(f"the {axis.name} axis of {axis.size} spans {axis.nodes_spanned} nodes unevenly: MaxText's "
                                     "ici × dcn degrees cannot express it", fix="use --format json, or a mesh whose cross-node "
                                     "axes divide evenly over the nodes")
        ici[name] *= axis.size // axis.nodes_spanned
        dcn[name] *= axis.nodes_spanned
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
