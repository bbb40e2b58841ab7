"""Compile a `Plan`'s training step with ``jax.jit`` on its device mesh, from abstract inputs.

Nothing is allocated: parameters, optimizer state and the batch are
``jax.ShapeDtypeStruct``s carrying the plan's ``NamedSharding``s, so any model size
compiles. The compiled module gives per-device memory (``memory_analysis()``), FLOPs
(``cost_analysis()``, whose while-loop bodies count once: reported as they are, not yet
scaled by trip counts) and its collectives (static count). Meshes are emulated CPU devices unless real ones exist; run
it in a fresh process with ``XLA_FLAGS=--xla_force_host_platform_device_count=N``
(`compile_in_subprocess` does that).

Pipeline parallelism is compiled as layer-sharded weights under plain ``jit`` (no
``shard_map`` schedule yet), so pipeline plans check shardings and memory, not the schedule.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from costmodel.errors import InvalidPlanError
from planner.schema import Plan

_COLLECTIVE = re.compile(r"\b(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\(")


class CompileReport(BaseModel):
    """What XLA made of the plan on its mesh."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_devices: int = Field(description="Devices in the mesh compiled for.")
    compile_time_s: float = Field(description="Lowering plus compilation seconds.")
    argument_bytes: float = Field(description="memory_analysis().argument_size_in_bytes, per device.")
    temp_bytes: float = Field(description="memory_analysis().temp_size_in_bytes, per device.")
    peak_bytes: float = Field(description="Arguments + outputs − aliased + temporaries, per device.")
    flops_as_reported: float = Field(description="cost_analysis() FLOPs per device as XLA reports them: the scanned layer counted once.")
    collectives: dict[str, int] = Field(description="Collective ops in the compiled module, by kind (static count).")


def compile_plan(plan: Plan) -> CompileReport:
    """Lower and compile the reference train step with the plan's shardings (in this process)."""
    import jax

    from validate.lowering import abstract_inputs, device_mesh, train_step

    mesh = device_mesh(plan)
    args = abstract_inputs(plan, mesh)
    start = time.perf_counter()
    try:
        compiled = jax.jit(train_step(plan, mesh)).lower(*args).compile()
    except Exception as err:  # XLA reports sharding mistakes as assorted exception types
        raise InvalidPlanError(f"XLA could not compile the plan: {str(err).splitlines()[0][:300]}",
                               fix="check param_specs against the parameter shapes (plan --format specs)") from err
    compile_time_s = time.perf_counter() - start
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    kinds = Counter(m.group(1) for m in _COLLECTIVE.finditer(compiled.as_text()))
    return CompileReport(
        n_devices=plan.layout.n_devices, compile_time_s=compile_time_s,
        argument_bytes=float(mem.argument_size_in_bytes), temp_bytes=float(mem.temp_size_in_bytes),
        peak_bytes=float(mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes + mem.temp_size_in_bytes),
        flops_as_reported=float(cost.get("flops", 0.0)), collectives=dict(sorted(kinds.items())),
    )


def compile_in_subprocess(plan: Plan, *, timeout_s: float = 600) -> CompileReport:
    """`compile_plan` in a fresh Python with the plan's device count emulated on the CPU."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={plan.layout.n_devices}", JAX_PLATFORMS="cpu")
    code = ("import sys; from planner.schema import Plan; from validate.compile_check import compile_plan; "
            "print(compile_plan(Plan.model_validate_json(sys.stdin.read())).model_dump_json())")
    proc = subprocess.run([sys.executable, "-c", code], input=plan.model_dump_json(), capture_output=True, text=True,
                          env=env, timeout=timeout_s)
    if proc.returncode != 0:
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit code {proc.returncode}"
        raise InvalidPlanError(f"compiling the plan failed: {last[:300]}", fix="run with --debug to see the compiler's output")
    return CompileReport.model_validate(json.loads(proc.stdout.strip().splitlines()[-1]))
