"""Knobs a described run leaves unstated, chosen by the planner (``plan simulate --micro-batch auto``).

A published run usually states its degrees and its stack but not always its micro-batch,
pipeline interleaving, recompute policy or sequence parallelism, and the stated columns alone
may not even fit in memory. `choose_unstated` keeps every stated part of the layout as given and
tries each value of the unstated ones the layout can carry: micro-batches dividing a replica's
share of the global batch, interleavings dividing a stage's layers (with pipeline stages),
the stack's recompute policies, sequence parallelism with or without (with tensor parallelism).
The fastest layout that fits wins; when none fits, the one needing the least memory, so the
caller can say so.

>>> from costmodel.hardware.machine import train_machine
>>> from costmodel.hardware.registry import load_hardware
>>> m = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, ffn_size=4096, vocab_size=32000)
>>> train = TrainConfig(global_batch=64)
>>> choice = choose_unstated(m, train, Layout(dp=8), train_machine(load_hardware("h100-sxm"), train), unstated=("micro_batch",))
>>> choice.chosen, choice.evaluated, choice.fits
({'micro_batch': 8}, 4, True)
"""

from __future__ import annotations

import itertools
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from costmodel.errors import InvalidPlanError
from costmodel.hardware.machine import Machine
from costmodel.inputs.layout import Layout, Recompute, Schedule, stack_recompute
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.estimate import StepEstimate
from costmodel.step.simulator import simulate
from search.layouts import divisors

UNSTATABLE = ("micro_batch", "interleave", "recompute", "sequence_parallel")  # what a run may leave to the planner


class UnstatedChoice(BaseModel):
    """The layout with the unstated knobs chosen, its estimate, and what was tried."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    layout: Layout = Field(description="The stated layout with the unstated knobs set.")
    estimate: StepEstimate = Field(description="Its simulation.")
    chosen: dict[str, Any] = Field(description="Each unstated knob and the value chosen.")
    evaluated: int = Field(description="Layouts simulated.")
    fits: bool = Field(description="Whether the chosen layout fits in memory (False: none of those tried does; the least memory won).")


def candidates(model: ModelConfig, train: TrainConfig, stated: Layout, knob: str) -> list[Any]:
    """The values of ``knob`` tried with the ``stated`` layout's other parts.

    >>> m = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, ffn_size=4096, vocab_size=32000)
    >>> candidates(m, TrainConfig(global_batch=64), Layout(dp=8), "micro_batch")
    [1, 2, 4, 8]
    >>> candidates(m, TrainConfig(global_batch=64), Layout(dp=8, tp=2), "sequence_parallel")
    [False, True]
    """
    if knob == "micro_batch":
        return divisors(train.global_batch // stated.dp) if train.global_batch % stated.dp == 0 else []
    if knob == "interleave":
        return divisors(model.num_layers // stated.pp) if stated.pp > 1 and model.num_layers % stated.pp == 0 else [1]
    if knob == "recompute":
        return list(dict.fromkeys(stack_recompute(r, stated.stack) for r in (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)))
    if knob == "sequence_parallel":
        return [False, True] if stated.tp > 1 else [False]
    raise ValueError(f"{knob} is not a knob a run may leave unstated ({', '.join(UNSTATABLE)})")


def choose_unstated(model: ModelConfig, train: TrainConfig, stated: Layout, machine: Machine, *,
                    unstated: tuple[str, ...]) -> UnstatedChoice:
    """The fastest fitting layout over the ``unstated`` knobs' `candidates` (module docstring);
    an unstated knob with no value the layout can carry is refused in one line."""
    values = {knob: candidates(model, train, stated, knob) for knob in unstated}
    if empty := [knob for knob, v in values.items() if not v]:
        raise InvalidPlanError(f"no {empty[0].replace('_', '-')} divides {train.global_batch} sequences over dp {stated.dp}",
                               fix="give a --global-batch that --dp divides")
    best: tuple[tuple[float, ...], Layout, StepEstimate] | None = None
    evaluated = 0
    for combination in itertools.product(*values.values()):
        update = dict(zip(values, combination))
        if "interleave" in update:
            update["schedule"] = Schedule.INTERLEAVED if update["interleave"] > 1 else stated.schedule
        try:
            layout = Layout(**{**stated.model_dump(), **update})
        except ValidationError:  # a combination the layout cannot carry (sequence parallelism with this stack, say)
            continue
        estimate = simulate(model, train, layout, machine)
        evaluated += 1
        fits = estimate.fits is not False
        key = (0.0, estimate.step_time_s) if fits else (1.0, estimate.memory.total_bytes)
        if best is None or key < best[0]:
            best = (key, layout, estimate)
    if best is None:
        raise InvalidPlanError("no value of the unstated knobs makes a valid layout with the stated ones",
                               fix="state them (e.g. --micro-batch 1 --recompute none)")
    _, layout, estimate = best
    return UnstatedChoice(layout=layout, estimate=estimate, chosen={knob: getattr(layout, knob) for knob in unstated},
                          evaluated=evaluated, fits=estimate.fits is not False)
