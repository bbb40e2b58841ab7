"""``plan --format deepspeed``: the DeepSpeed config JSON of a plan, with the launcher's arguments.

Every key is one DeepSpeed's ``deepspeed/runtime/constants.py`` or its ZeRO / bf16 config
classes define at the commit in ``planner/cli/export_schemas/deepspeed.json`` (tested against
it). DeepSpeed itself parallelises data (ZeRO); tensor and pipeline degrees are the model
code's (Megatron-DeepSpeed's flags), so they are given as ``launcher`` arguments beside it.

>>> from planner.api import plan
>>> out = to_deepspeed(plan("llama3-8b", mesh="data=8", hardware="h100-sxm", global_batch=64, stack="deepspeed"))
>>> out["config"]["train_batch_size"], out["config"]["zero_optimization"]["stage"] in (0, 1, 2, 3)
(64, True)
"""

from __future__ import annotations

import math
from typing import Any

from costmodel.inputs.train_config import Precision
from planner.cli.exports.megatron import to_megatron
from planner.plan_schema import Plan

# The Megatron-DeepSpeed flags that carry the model-parallel part of the plan.
_MODEL_PARALLEL_FLAGS = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--sequence-parallel",
                         "--micro-batch-size", "--global-batch-size", "--seq-length")


def to_deepspeed(plan: Plan) -> dict[str, Any]:
    """``{"config": ds_config, "launcher": [...], "script_args": [...]}``: the JSON DeepSpeed's ``initialize`` reads
    (batch sizes, ZeRO stage and offload, precision, activation checkpointing) and the
    ``deepspeed`` launcher's node and GPU counts with the model-parallel flags for the script."""
    lay, train = plan.layout, plan.train
    config: dict[str, Any] = {
        "train_batch_size": train.global_batch,
        "train_micro_batch_size_per_gpu": lay.micro_batch,
        "gradient_accumulation_steps": lay.micro_batches(train),
        "zero_optimization": {"stage": lay.zero_stage if lay.dp > 1 else 0, "overlap_comm": lay.stack.dp_overlap,
                              "contiguous_gradients": True},
        "bf16": {"enabled": train.precision in (Precision.BF16, Precision.FP8)},
        "fp16": {"enabled": train.precision is Precision.FP16},
        "gradient_clipping": 1.0,
    }
    if lay.offload != "none":
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if lay.recompute != "none":
        config["activation_checkpointing"] = {"partition_activations": lay.tp > 1, "contiguous_memory_optimization": False}
    nodes = max(1, math.prod(a.nodes_spanned for a in plan.mesh))
    return {"config": config, "launcher": ["--num_nodes", str(nodes), "--num_gpus", str(lay.n_devices // nodes)],
            "script_args": _script_flags(plan)}


def _script_flags(plan: Plan) -> list[str]:
    """The Megatron-DeepSpeed training script's model-parallel flags (Megatron's names)."""
    flags, out, keep = to_megatron(plan), [], False
    for flag in flags:
        if flag.startswith("--"):
            keep = flag in _MODEL_PARALLEL_FLAGS
        if keep:
            out.append(flag)
    return out
