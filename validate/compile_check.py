"""Compile a `Plan`'s training step with ``jax.jit`` on its device mesh, from abstract inputs.

Nothing is allocated: parameters, optimizer state and the batch are
``jax.ShapeDtypeStruct``s carrying the plan's ``NamedSharding``s, so any model size
compiles. The compiled module gives per-device memory (``memory_analysis()``), matmul
FLOPs and every collective with its bytes, mesh axes and loop trip counts
(`validate.hlo`). Meshes are emulated CPU devices unless real ones exist; run it in a
fresh process with ``XLA_FLAGS=--xla_force_host_platform_device_count=N``
(`compile_in_subprocess` does that).
"""

from __future__ import annotations

import resource
import time

import jax
from pydantic import BaseModel, ConfigDict, Field

from costmodel.errors import InvalidPlanError
from planner.plan_schema import Plan
from planner.programs.decode import check_serving_lowered
from planner.programs.xla_options import compile_options
from validate.emulated import run_emulated
from validate.hlo import Collective, collectives, dot_flops
from validate.lowering import abstract_inputs, check_param_specs, jitted_step
from validate.mesh_hooks import device_mesh
from validate.split_backward import branch_shares

# XLA may otherwise drop a bf16 round trip (f32 → bf16 → f32) where a backend computes in
# f32: the CPU backend then loses the trace of which collectives the program runs in bf16
# (`validate.hlo` reads it from those converts).
COMPILER_OPTIONS = {"xla_allow_excess_precision": False}


class CompileReport(BaseModel):
    """What XLA made of the plan on its mesh, per device."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_devices: int = Field(description="Devices in the mesh compiled for.")
    n_processes: int = Field(1, description="JAX processes the mesh spans.")
    platform: str = Field("cpu", description="The backend compiled for (cpu, gpu, tpu).")
    compile_time_s: float = Field(description="Lowering plus compilation seconds.")
    peak_rss_bytes: float = Field(description="Peak resident memory of the compiling process.")
    argument_bytes: float = Field(description="memory_analysis().argument_size_in_bytes.")
    output_bytes: float = Field(description="memory_analysis().output_size_in_bytes.")
    alias_bytes: float = Field(description="memory_analysis().alias_size_in_bytes (donated inputs reused as outputs).")
    temp_bytes: float = Field(description="memory_analysis().temp_size_in_bytes: the backend's temporaries.")
    flops_as_reported: float = Field(description="cost_analysis() FLOPs: while-loop bodies counted once.")
    matmul_flops: float = Field(description="Matmul FLOPs read from the module's dots, loop bodies times their trip counts.")
    collectives: tuple[Collective, ...] = Field(description="Every collective of the compiled module.")

    @property
    def peak_bytes(self) -> float:
        """Arguments + outputs − aliased + temporaries."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes


def compile_plan(plan: Plan) -> CompileReport:
    """Lower and compile the plan's train step (`validate.lowering.jitted_step`) in this process,
    on ``jax.devices()`` (the global devices under ``jax.distributed``), with the program's options for
    their platform (`planner.programs.xla_options`)."""
    check_param_specs(plan)
    mesh = device_mesh(plan)
    args = abstract_inputs(plan, mesh)
    start = time.perf_counter()
    try:
        options = COMPILER_OPTIONS | compile_options(plan.layout, jax.devices()[0].platform)
        compiled = jitted_step(plan, mesh).lower(*args).compile(options)
    except Exception as err:  # XLA reports sharding mistakes as assorted exception types
        raise InvalidPlanError(f"XLA could not compile the plan: {str(err).splitlines()[0][:300]}",
                               fix="check param_specs against the parameter shapes (plan --format specs)") from err
    compile_time_s = time.perf_counter() - start
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    text = compiled.as_text()
    mesh_shape = tuple((a.name, a.size) for a in plan.mesh)
    shares = branch_shares(plan)
    return CompileReport(
        n_devices=plan.layout.n_devices, n_processes=jax.process_count(), platform=jax.devices()[0].platform,
        compile_time_s=compile_time_s,
        peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0,
        argument_bytes=float(mem.argument_size_in_bytes), output_bytes=float(mem.output_size_in_bytes),
        alias_bytes=float(mem.alias_size_in_bytes), temp_bytes=float(mem.temp_size_in_bytes),
        flops_as_reported=float(cost.get("flops", 0.0)), matmul_flops=dot_flops(text, shares),
        collectives=tuple(collectives(text, mesh_shape=mesh_shape, branch_shares=shares)),
    )


def compile_in_subprocess(plan: Plan, *, timeout_s: float = 600) -> CompileReport:
    """`compile_plan` in a fresh Python with the plan's device count emulated on the CPU."""

    check_param_specs(plan)  # here, so a broken spec is named in plain words rather than by the child's traceback
    if not plan.train.workload.runs_backward:
        check_serving_lowered(plan.model)  # likewise
    code = ("import sys; from planner.plan_schema import Plan; from validate.compile_check import compile_plan; "
            "print(compile_plan(Plan.model_validate_json(sys.stdin.read())).model_dump_json())")
    return CompileReport.model_validate_json(run_emulated(code, plan.layout.n_devices, stdin=plan.model_dump_json(), timeout_s=timeout_s,
                                                          failure="compiling the plan failed", error=InvalidPlanError,
                                                          fix="run with --debug to see the compiler's output"))
