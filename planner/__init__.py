"""Planner: model configs, reference JAX models, graph extraction, layout planning, the CLI.

The public API, importable from a notebook::

    import planner
    p = planner.plan("llama3-8b", mesh="8x4", hardware="h100-sxm")  # or planner.plan(planner.PlanRequest(...))
    specs = planner.partition_spec_tree(p.model, p.param_specs)
    sharded = planner.intraop.shard(train_step, *abstract_inputs, mesh="data=8,tensor=4")  # any jittable function

Names are loaded on first use, so ``plan simulate`` starts without importing JAX.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "plan": "planner.api",
    "layout_plan": "planner.api",
    "PlanRequest": "planner.request",
    "PlannerName": "planner.request",
    "Plan": "planner.plan_schema",
    "load_model": "planner.config",
    "from_hf_config": "planner.config",
    "train_config": "planner.config",
    "ModelConfig": "costmodel.inputs.model_config",
    "TrainConfig": "costmodel.inputs.train_config",
    "extract_graph": "planner.intraop.extract",
    "inspect_model": "planner.inspect",
    "partition_spec_tree": "planner.shardings",
    "shard": "planner.intraop.shard",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
