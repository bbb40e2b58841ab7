"""How often the plan's program runs each part per step, and the record a predicted collective is.

Shared by the validator's predictions (`validate.predict`, `validate.predict_data_parallel`,
`validate.predict_lora`, `validate.predict_serving`): a GPipe or interleaved pipeline runs its
stage's layers on every tick of its loop, bubbles included, so what one layer issues runs ``slots ×
ticks`` times; the split-backward 1F1B (`validate.split_backward`) runs each only on its real
micro-batches (idle slots take a branch that does nothing).

>>> from costmodel.inputs.layout import Layout
>>> from planner.api import layout_plan
>>> p = layout_plan("llama3-8b", Layout(dp=8, tp=4, micro_batch=1, recompute="full", zero_stage=1), seq_len=2048, global_batch=16)
>>> program_runs(p).layer_runs  # 32 layers on each of 2 micro-batches
64
"""

from __future__ import annotations

import math
from typing import Any

import jax
from pydantic import BaseModel, ConfigDict, Field

from costmodel.step.lockstep import gpipe_ticks, one_f_one_b_ticks, split_backward_periods
from planner.plan_schema import Plan
from planner.programs.params import abstract_params
from planner.shardings import entry_axes
from validate.one_f_one_b import runs_one_f_one_b
from validate.split_backward import accumulates_over_data_locally, runs_split_backward

F32_BYTES = 4


class PredictedCollective(BaseModel):
    """One group of collectives the program should issue."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str = Field(description="all-reduce, all-gather, reduce-scatter, all-to-all or collective-permute.")
    axes: tuple[str, ...] = Field(description="Mesh axes of its groups.")
    bytes_per_call: float = Field(description="Per-device buffer bytes of one execution.")
    calls: int = Field(description="Executions per step.")
    why: str = Field(description="What it is.")

    @property
    def total_bytes(self) -> float:
        return self.bytes_per_call * self.calls


def param_shards(plan: Plan, specs: dict[str, tuple[Any, ...]] | None = None) -> dict[str, tuple[float, tuple[Any, ...], tuple[int, ...]]]:
    """Parameter path → (elements per device, spec, global shape), under the plan's ``param_specs``
    or the given ``specs`` (e.g. ZeRO's moment specs)."""
    sizes = {a.name: a.size for a in plan.mesh}
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_params(plan.model))[0]:
        name = "/".join(str(p.key) for p in path)
        spec = (specs or plan.param_specs)[name]
        split = math.prod(sizes[a] for d in spec for a in entry_axes(d))
        out[name] = (math.prod(leaf.shape) / split, spec, leaf.shape)
    return out


class ProgramRuns(BaseModel):
    """How often the program runs each part, per device per step."""

    layer_runs: int = Field(description="Executions of one layer's forward (and backward) on one micro-batch.")
    layers_held: int = Field(description="Layers whose parameters this device holds.")
    outer_calls: int = Field(description="Executions of the embedding (and, but for 1F1B, of the head).")
    outer_micro_batches: int = Field(description="Micro-batches the embedding takes per execution.")
    head_calls: int = Field(description="Executions of the head (inside the 1F1B schedules once per tick, or per period of three slots).")
    head_micro_batches: int = Field(description="Micro-batches the head runs on per step, masked ones included.")
    head_gradients: int = Field(description="Gradients of the head's weights formed (and reduced) apart: one per micro-batch.")
    summed_locally: bool = Field(False, description="The layers' and the head's gradients summed per data replica over the "
                                 "loop and reduced once after it (`validate.split_backward.accumulates_over_data_locally`), "
                                 "not each as it is formed.")


def program_runs(plan: Plan) -> ProgramRuns:
    """How often the plan's program runs its layers, embedding and head per step (`ProgramRuns`)."""
    lay, layers = plan.layout, plan.model.num_layers
    micro = lay.micro_batches(plan.train)
    if lay.pp == 1:
        return ProgramRuns(layer_runs=layers * micro, layers_held=layers, outer_calls=micro, outer_micro_batches=1, head_calls=micro,
                           head_micro_batches=micro, head_gradients=micro)
    # Each tick runs one chunk's slots; interleaved, M·v items pass each device (`validate.gpipe.work_item`).
    slots = lay.layers_on_stage(layers, 0) // lay.interleave
    if runs_split_backward(plan):
        # Each layer runs forward and backward once a micro-batch; the head once a period (`validate.split_backward`).
        periods = split_backward_periods(micro, lay.pp)
        return ProgramRuns(layer_runs=slots * micro, layers_held=layers // lay.pp, outer_calls=1, outer_micro_batches=micro,
                           head_calls=periods, head_micro_batches=periods, head_gradients=periods,
                           summed_locally=accumulates_over_data_locally(plan))
    if runs_one_f_one_b(plan):
        # Every tick runs the stage's forward and backward and the head on one micro-batch (`validate.one_f_one_b`).
        ticks = pipeline_ticks(plan)
        return ProgramRuns(layer_runs=slots * ticks, layers_held=layers // lay.pp, outer_calls=1, outer_micro_batches=micro,
                           head_calls=ticks, head_micro_batches=ticks, head_gradients=ticks)
    # One execution of the embedding and the head on the whole batch, the head one micro-batch
    # after another with its gradients formed at once (`validate.gpipe.micro_batch_mean`).
    return ProgramRuns(layer_runs=slots * pipeline_ticks(plan), layers_held=layers // lay.pp, outer_calls=1, outer_micro_batches=micro,
                       head_calls=1, head_micro_batches=micro, head_gradients=micro)


def pipeline_ticks(plan: Plan) -> int:
    """Ticks of the pipeline's loop, each ending with its hand-offs: ``M·v`` items per device, plus ``S − 1``
    to fill it (interleaved 1F1B: plus `costmodel.step.lockstep.backward_lag_ticks` and ``S − 1`` to bring the
    last gradient back); the split-backward 1F1B's slots, ``3(M + S − 1)``."""
    lay = plan.layout
    if runs_split_backward(plan):
        return 3 * split_backward_periods(lay.micro_batches(plan.train), lay.pp)
    if runs_one_f_one_b(plan):
        return one_f_one_b_ticks(lay.micro_batches(plan.train), lay.pp, lay.interleave)
    return gpipe_ticks(lay.micro_batches(plan.train), lay.pp, lay.interleave)
