"""Timed validation: run the plan's step on real (or emulated) devices and compare with the simulator.

`time_plan` builds concrete sharded inputs (random parameters, zero moments, random
tokens), runs the jitted step (`validate.lowering.jitted_step`) ``warmup`` times, then times
``repeats`` blocks of ``steps`` steps; the median block gives the step time, the spread of
the blocks says how much to trust it (emulated devices sharing 2 cores swing by tens of
percent). `predicted_cpu_step_s` is the simulator's answer for the same program on the
measured ``cpu`` profile: float32 compute (bf16 matmuls are emulated and slow on CPUs),
materialized attention, every kernel unfused as XLA's CPU backend mostly leaves them.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

from pydantic import BaseModel, ConfigDict, Field

from costmodel.errors import PlannerError
from costmodel.layout import Attention
from costmodel.machine import machine_for
from costmodel.simulator import simulate
from costmodel.train_config import Dtype
from planner.schema import Plan
from validate.cpu_profile import CpuMeasurement, cpu_cluster


class TimedRun(BaseModel):
    """Measured step times of one plan."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_devices: int = Field(description="Devices the step ran on.")
    steps: int = Field(description="Steps per timed block.")
    block_step_s: tuple[float, ...] = Field(description="Mean step seconds of each timed block.")
    load_average: float = Field(description="1-minute load average of the host when the timing ended.")

    @property
    def median_step_s(self) -> float:
        return statistics.median(self.block_step_s)

    @property
    def spread(self) -> float:
        """(slowest − fastest) / median block."""
        return (max(self.block_step_s) - min(self.block_step_s)) / self.median_step_s


def cpu_plan(plan: Plan) -> Plan:
    """The plan as the CPU runs it: float32 compute."""
    return plan.model_copy(update={"train": plan.train.model_copy(update={"compute_dtype": Dtype.FP32})})


def predicted_cpu_step_s(plan: Plan, measured: CpuMeasurement) -> float:
    """Simulated step seconds of ``plan``'s program on the measured host shared by its devices."""
    machine = machine_for(cpu_cluster(measured, n_devices=plan.layout.n_devices), compute_dtype="float32")
    layout = plan.layout.model_copy(update={"attention": Attention.MATERIALIZED, "fused_elementwise": False})
    return simulate(plan.model, cpu_plan(plan).train, layout, machine).step_time_s


def time_plan(plan: Plan, *, steps: int = 3, repeats: int = 5, warmup: int = 2, seed: int = 0) -> TimedRun:
    """Time the plan's step in this process (it must see the plan's device count)."""
    import jax

    from planner.models.params import init_params
    from planner.models.train_step import init_opt_state
    from validate.lowering import device_mesh, input_specs, jitted_step

    plan = cpu_plan(plan)
    mesh = device_mesh(plan)
    params = init_params(plan.model, jax.random.key(seed))
    tokens = jax.random.randint(jax.random.key(seed + 1), (plan.train.global_batch, plan.train.seq_len), 0, plan.model.vocab_size)
    shardings = jax.tree.map(lambda s: jax.NamedSharding(mesh, s), input_specs(plan))
    state = jax.device_put((params, init_opt_state(params)), shardings[:2])
    batch = jax.device_put({"tokens": tokens, "targets": tokens}, shardings[2])
    step = jitted_step(plan, mesh)
    for _ in range(warmup):
        *state, metrics = step(*state, batch)
    jax.block_until_ready(metrics)
    blocks = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            *state, metrics = step(*state, batch)
        jax.block_until_ready((state, metrics))
        blocks.append((time.perf_counter() - start) / steps)
    return TimedRun(n_devices=plan.layout.n_devices, steps=steps, block_step_s=tuple(blocks), load_average=os.getloadavg()[0])


def time_in_subprocess(plan: Plan, *, steps: int = 3, repeats: int = 5, timeout_s: float = 600) -> TimedRun:
    """`time_plan` in a fresh Python with the plan's device count emulated on the CPU."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={plan.layout.n_devices}", JAX_PLATFORMS="cpu")
    code = ("import sys; from planner.schema import Plan; from validate.timed import time_plan; "
            f"print(time_plan(Plan.model_validate_json(sys.stdin.read()), steps={steps}, repeats={repeats}).model_dump_json())")
    proc = subprocess.run([sys.executable, "-c", code], input=plan.model_dump_json(), capture_output=True, text=True, env=env,
                          timeout=timeout_s)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        raise PlannerError(f"timing the plan failed: {lines[-1][:300] if lines else proc.returncode}", fix="run with --debug")
    return TimedRun.model_validate_json(proc.stdout.strip().splitlines()[-1])
