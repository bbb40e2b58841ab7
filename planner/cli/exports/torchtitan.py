"""``plan --format torchtitan``: torchtitan's TOML job config sections of a plan.

Every key is a field of torchtitan's ``JobConfig`` (``torchtitan/config/job_config.py``) at the
release in ``planner/cli/export_schemas/torchtitan.json`` (v0.2.2, the last one read from TOML;
later torchtitan configures runs in Python, with the same section and field names).

>>> from planner.api import plan
>>> toml = to_torchtitan_toml(plan("llama3-8b", mesh="data=4,tensor=8", hardware="h100-sxm", global_batch=64, stack="torchtitan"))
>>> "tensor_parallel_degree = 8" in toml
True
"""

from __future__ import annotations

from typing import Any

from costmodel.errors import InvalidConfigError
from costmodel.inputs.layout import Recompute, Schedule
from planner.plan_schema import Plan

# torchtitan's activation_checkpoint.mode and selective_ac_option for each policy; Megatron's
# selective (attention core only) has no torchtitan counterpart, per-op keeps about as much.
_AC = {Recompute.NONE: ("none", None), Recompute.FULL: ("full", None), Recompute.SELECTIVE: ("selective", "op"),
       Recompute.SELECTIVE_OP: ("selective", "op"), Recompute.SELECTIVE_LAYER: ("selective", "2")}
_SCHEDULES = {Schedule.ONE_F_ONE_B: "1F1B", Schedule.INTERLEAVED: "Interleaved1F1B", Schedule.GPIPE: "GPipe"}


def to_torchtitan(plan: Plan) -> dict[str, dict[str, Any]]:
    """``{section: {key: value}}``: [parallelism] degrees (ZeRO 3 as FSDP's shard degree, plain
    data parallelism as the replicate degree), [training] batch and sequence, [activation_checkpoint]."""
    lay, train = plan.layout, plan.train
    if lay.stage_layers:
        raise InvalidConfigError(f"uneven pipeline stages {lay.stage_layers}", fix="use --format json")
    sharded = lay.zero_stage == 3
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": 1 if sharded else lay.dp, "data_parallel_shard_degree": lay.dp if sharded else 1,
        "tensor_parallel_degree": lay.tp, "pipeline_parallel_degree": lay.pp, "context_parallel_degree": lay.cp,
        "expert_parallel_degree": lay.ep,
    }
    if lay.pp > 1:
        parallelism["pipeline_parallel_schedule"] = _SCHEDULES.get(lay.schedule, "1F1B")
        parallelism["pipeline_parallel_microbatch_size"] = lay.micro_batch
    mode, option = _AC[lay.recompute]
    checkpoint: dict[str, Any] = {"mode": mode} | ({"selective_ac_option": option} if option else {})
    training = {"local_batch_size": train.global_batch // lay.dp, "global_batch_size": train.global_batch, "seq_len": train.seq_len,
                "mixed_precision_param": "float32" if train.precision == "fp32" else "bfloat16",
                "enable_cpu_offload": lay.offload != "none"}
    return {"parallelism": parallelism, "training": training, "activation_checkpoint": checkpoint}


def to_torchtitan_toml(plan: Plan) -> str:
    """`to_torchtitan` written as TOML."""
    lines = []
    for section, values in to_torchtitan(plan).items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            text = ("true" if value else "false") if isinstance(value, bool) else f'"{value}"' if isinstance(value, str) else str(value)
            lines.append(f"{key} = {text}")
        lines.append("")
    return "\n".join(lines)
