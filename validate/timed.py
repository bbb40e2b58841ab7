"""Timed check: run the plan's step on real (or emulated) devices and compare with the simulator.

`time_plan` builds concrete sharded inputs (random parameters, zero moments, random
tokens), jits the plan's step (`validate.lowering.jitted_step`: the plan's shardings on
inputs and outputs, parameters and optimizer state donated), runs ``warmup`` steps, then
``repeats`` repeats of ``steps`` steps, each step timed to ``block_until_ready``. A repeat's
median step is its time; the median over repeats is the step time, and their range its
spread: emulated devices sharing 2 cores swing by tens of percent, so one run says little.

`predicted_step_s` is the simulator's answer for the same program on the measured ``cpu``
profile (`validate.cpu_profile`) for the same device count: float32 compute (the timed
plan's, see `cpu_plan`), materialized attention (the reference program builds the score
matrix), elementwise chains fused (XLA's loop fusions), and no overlap of gradient
reduction with compute (on a CPU the same cores compute and copy).

>>> from costmodel.inputs.layout import Layout
>>> from planner.api import layout_plan
>>> p = layout_plan("gpt2", Layout(micro_batch=2), hardware="cpu", seq_len=64, global_batch=2)
>>> cpu_plan(p).train.compute_dtype.value
'float32'
"""

from __future__ import annotations

import os
import statistics
import time

import jax
from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveInt, computed_field

from costmodel.errors import InfeasibleError, InvalidPlanError
from costmodel.hardware.machine import machine_for
from costmodel.hardware.profile import ClusterSpec
from costmodel.inputs.stack import Attention, stack_with
from costmodel.inputs.train_config import Dtype
from costmodel.step.estimate import StepEstimate
from costmodel.step.simulator import simulate
from planner.plan_schema import Plan
from validate.cpu_profile import cached_measurement, cpu_clock, cpu_cluster, other_cpu_share
from validate.emulated import run_emulated
from validate.lowering import initial_inputs, jitted_step
from validate.mesh_hooks import device_mesh
from validate.report import Check


class TimedRun(BaseModel):
    """Measured step times of one plan."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_devices: PositiveInt = Field(description="Devices the step ran on.")
    steps: PositiveInt = Field(description="Steps timed in each repeat.")
    warmup: int = Field(description="Steps run (compilation included) before timing.")
    repeat_step_s: tuple[float, ...] = Field(min_length=1, description="Median step seconds of each repeat.")
    load_average: tuple[NonNegativeFloat, NonNegativeFloat] = Field(
        description="1-minute load average before warm-up and after the last repeat (this process's threads included).")
    other_cpu_share: NonNegativeFloat | None = Field(
        description="Share of the host's cores other processes kept busy during the repeats (/proc/stat; None where unreadable).")

    @computed_field(description="Median over repeats of the repeats' median step seconds.")
    @property
    def median_step_s(self) -> float:
        return statistics.median(self.repeat_step_s)

    @computed_field(description="(slowest − fastest repeat) / median: how far one repeat can be off.")
    @property
    def spread(self) -> float:
        return (max(self.repeat_step_s) - min(self.repeat_step_s)) / self.median_step_s


def cpu_plan(plan: Plan) -> Plan:
    """The plan as the timed check runs it: float32 compute, since this CPU's bf16 GEMMs are no
    faster and XLA's CPU backend converts bf16 around most ops (`validate.cpu_profile`)."""
    return plan.model_copy(update={"train": plan.train.model_copy(update={"compute_dtype": Dtype.FP32})})


def cpu_estimate(plan: Plan, cluster: ClusterSpec) -> StepEstimate:
    """The simulator's estimate of the timed program (`cpu_plan`) on ``cluster``, a ``cpu``
    profile measured with the plan's device count."""
    n = plan.layout.n_devices
    if cluster.devices_per_node != n:
        raise InvalidPlanError(f"the profile was measured with {cluster.devices_per_node} devices sharing the host, the plan runs {n}",
                               fix=f"use cpu_cluster(cached_measurement({n}))")
    stack = stack_with(plan.layout.stack, attention=Attention.MATERIALIZED, fused_elementwise=True, dp_overlap=False)
    layout = plan.layout.model_copy(update={"stack": stack})
    train = cpu_plan(plan).train
    return simulate(plan.model, train, layout, machine_for(cluster, compute_dtype=train.compute_dtype.value))


def predicted_step_s(plan: Plan, cluster: ClusterSpec) -> float:
    """Predicted seconds of one step of the timed program (`cpu_estimate`)."""
    return cpu_estimate(plan, cluster).step_time_s


def time_plan(plan: Plan, *, steps: int = 3, repeats: int = 5, warmup: int = 2, seed: int = 0) -> TimedRun:
    """Time `cpu_plan` (``plan`` in float32) in this process, which must see the plan's
    device count (`time_in_subprocess` makes sure it does)."""


    load_before = os.getloadavg()[0]
    plan = cpu_plan(plan)
    mesh = device_mesh(plan)
    params, opt_state, batch = initial_inputs(plan, mesh, seed=seed)
    step = jitted_step(plan, mesh)
    for _ in range(warmup):
        params, opt_state, metrics = step(params, opt_state, batch)
    jax.block_until_ready(metrics)
    before = cpu_clock()
    medians = []
    for _ in range(repeats):
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            params, opt_state, metrics = jax.block_until_ready(step(params, opt_state, batch))
            times.append(time.perf_counter() - start)
        medians.append(statistics.median(times))
    return TimedRun(n_devices=plan.layout.n_devices, steps=steps, warmup=warmup, repeat_step_s=tuple(medians),
                    load_average=(load_before, os.getloadavg()[0]), other_cpu_share=other_cpu_share(before, cpu_clock()))


def time_in_subprocess(plan: Plan, *, steps: int = 3, repeats: int = 5, warmup: int = 2, timeout_s: float = 600) -> TimedRun:
    """`time_plan` in a fresh Python with the plan's device count emulated on the CPU."""
    code = ("import sys; from planner.plan_schema import Plan; from validate.timed import time_plan; "
            f"run = time_plan(Plan.model_validate_json(sys.stdin.read()), steps={steps}, repeats={repeats}, warmup={warmup}); "
            "print(run.model_dump_json(exclude={'median_step_s', 'spread'}))")
    return TimedRun.model_validate_json(run_emulated(code, plan.layout.n_devices, stdin=plan.model_dump_json(), timeout_s=timeout_s,
                                                     failure="timing the plan failed",
                                                     fix="run validate.timed.time_plan in a process with the plan's device count "
                                                         "to see why"))


def step_time_check(plan: Plan, *, compiled_peak_bytes: float, steps: int = 3, repeats: int = 5,
                    tolerance: float = 0.25) -> tuple[Check, TimedRun]:
    """Time the plan on this host's emulated CPU devices and compare with `predicted_step_s`
    on the ``cpu`` profile measured for its device count (`validate.cpu_profile`, cached).

    Refuses (`InfeasibleError`) a plan whose devices' compiled peak (``compiled_peak_bytes``
    each; float32 compute needs more) would not fit in half of this host's memory: all
    emulated devices share it."""
    n = plan.layout.n_devices
    need_bytes, host_bytes = compiled_peak_bytes * n, os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if need_bytes > host_bytes / 2:
        raise InfeasibleError(f"running {plan.model.name}'s step on {n} emulated CPU devices needs about {need_bytes / 2**30:.1f} GiB "
                              f"({n} x the compiled peak), more than half of this host's {host_bytes / 2**30:.1f} GiB",
                              fix="use --compile-only, or time a smaller model (python -m benchmarks.validate_timed)")
    predicted = predicted_step_s(plan, cpu_cluster(cached_measurement(n)))
    run = time_in_subprocess(plan, steps=steps, repeats=repeats)
    check = Check(item="step time", predicted=predicted, actual=run.median_step_s, source="measured", tolerance=tolerance, unit="s")
    return check, run
