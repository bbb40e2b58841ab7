"""Outer-knob layout search: enumerate layouts for a device count or mesh, prune, cost each.

Candidates are generated in a sorted, deterministic order over the knobs Megatron users
tune by hand — data, tensor, pipeline and context parallel degrees, micro-batch size,
activation recompute, sequence parallelism and ZeRO stage — and pruned by named
predicates (divisibility, tensor parallelism inside a node, memory). Every survivor is
costed by the one step simulator.

>>> from costmodel.machine import load_machine
>>> from costmodel.model_config import ModelConfig
>>> m = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, ffn_size=4096, vocab_size=32000)
>>> result = grid_search(m, TrainConfig(seq_len=1024, global_batch=32), load_machine("a100-80gb"), n_devices=8)
>>> result.best.layout.n_devices, result.evaluated > 1
(8, True)
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from typing import Iterator

from pydantic import BaseModel, ConfigDict, Field

from costmodel.errors import InfeasibleError, PlannerError
from costmodel.estimate import StepEstimate
from costmodel.layout import Attention, Layout, Recompute, Schedule, check_layout
from costmodel.machine import Machine
from costmodel.model_config import ModelConfig
from costmodel.simulator import balanced_layout, simulate
from costmodel.train_config import TrainConfig

_GIB = 2**30
MICRO_BATCHES = (1, 2, 4, 8)
RECOMPUTE = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)


class SearchSpace(BaseModel):
    """Which values each knob may take (the software facts are fixed, not searched)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    micro_batches: tuple[int, ...] = Field(MICRO_BATCHES, description="Micro-batch sizes tried.")
    recompute: tuple[Recompute, ...] = Field(RECOMPUTE, description="Recompute policies tried.")
    zero_stages: tuple[int, ...] = Field((0, 1, 3), description="ZeRO stages tried.")
    interleaves: tuple[int, ...] = Field((1, 2, 3, 4), description="Model chunks per pipeline device tried (pp > 1).")
    max_cp: int = Field(1, description="Largest context-parallel degree tried.")
    splits: tuple[tuple[int, int, int, int], ...] | None = Field(
        None, description="Allowed (dp, tp, pp, cp) degrees, e.g. those a fixed mesh can carry; None = every split."
    )
    attention: Attention = Field(Attention.FLASH, description="Attention kernel of the software stack.")
    dp_overlap: bool = Field(True, description="Whether the stack overlaps data-parallel communication.")
    fused_elementwise: bool = Field(True, description="Whether the stack fuses elementwise kernels.")
    uneven_stages: bool = Field(True, description="Also try each pipelined layout with layers cut into stages by the inter-op DP.")


class SearchResult(BaseModel):
    """The best layout, the runners-up, and what was evaluated and pruned."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    best: StepEstimate = Field(description="Fastest layout that fits.")
    runners_up: tuple[StepEstimate, ...] = Field(description="Next fastest fitting layouts, fastest first.")
    closest_misses: tuple[StepEstimate, ...] = Field(description="Layouts that did not fit, least over first.")
    evaluated: int = Field(description="Candidates costed by the simulator.")
    pruned: dict[str, int] = Field(description="Candidates dropped before simulation, by rule.")


def degree_splits(n_devices: int, *, max_cp: int = 1) -> Iterator[tuple[int, int, int, int]]:
    """(dp, tp, pp, cp) with product ``n_devices``, sorted.

    >>> list(degree_splits(4))
    [(1, 1, 4, 1), (1, 2, 2, 1), (1, 4, 1, 1), (2, 1, 2, 1), (2, 2, 1, 1), (4, 1, 1, 1)]
    """
    divisors = [d for d in range(1, n_devices + 1) if n_devices % d == 0]
    splits = [(dp, tp, n_devices // (dp * tp * cp), cp)
              for dp, tp, cp in itertools.product(divisors, divisors, [d for d in divisors if d <= max_cp])
              if n_devices % (dp * tp * cp) == 0]
    yield from sorted(splits)


def tensor_parallel_in_node(layout: Layout, devices_per_node: int) -> bool:
    """Tensor parallelism stays on the fast intra-node link (Megatron's rule of thumb)."""
    return layout.tp <= devices_per_node


def candidate_layouts(model: ModelConfig, train: TrainConfig, n_devices: int, space: SearchSpace,
                      pruned: Counter[str], *, devices_per_node: int) -> Iterator[Layout]:
    """Consistent layouts in a deterministic order; counts what it drops in ``pruned``."""
    splits = space.splits if space.splits is not None else tuple(degree_splits(n_devices, max_cp=space.max_cp))
    for (dp, tp, pp, cp), mb, recompute, zero, v in itertools.product(
        splits, space.micro_batches, space.recompute, space.zero_stages, space.interleaves
    ):
        if zero > 0 and dp == 1:
            pruned["ZeRO without data parallelism"] += 1
            continue
        if v > 1 and (pp == 1 or (train.global_batch // (dp * mb)) % pp):
            pruned["interleaving needs pp > 1 and micro-batches divisible by pp"] += 1
            continue
        layout = Layout(
            dp=dp, tp=tp, pp=pp, cp=cp, micro_batch=mb, recompute=recompute, sequence_parallel=tp > 1, zero_stage=zero,
            attention=space.attention, dp_overlap=space.dp_overlap, fused_elementwise=space.fused_elementwise, interleave=v,
            schedule=Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B,
        )
        if not tensor_parallel_in_node(layout, devices_per_node):
            pruned["tensor parallel across nodes"] += 1
            continue
        try:
            check_layout(layout, model, train, n_devices=n_devices)
        except PlannerError as err:
            pruned[re.sub(r"\d+", "N", err.cause)] += 1  # the rule, without this candidate's numbers
            continue
        yield layout


def grid_search(model: ModelConfig, train: TrainConfig, machine: Machine, *, n_devices: int,
                space: SearchSpace | None = None, keep: int = 5) -> SearchResult:
    """Cost every candidate layout; the fastest that fits wins.

    Raises:
      InfeasibleError: no candidate fits in memory (the message names the closest ones),
        or no candidate is consistent with the model at all.
    """
    space = space or SearchSpace()
    pruned: Counter[str] = Counter()
    fitting, missing, evaluated = [], [], 0
    for layout in candidate_layouts(model, train, n_devices, space, pruned, devices_per_node=machine.devices_per_node):
        variants = [layout]
        if space.uneven_stages:
            balanced = balanced_layout(model, train, layout, machine)
            variants += [balanced] if balanced.stage_layers else []
        for variant in variants:
            est = simulate(model, train, variant, machine)
            evaluated += 1
            (fitting if est.fits else missing).append(est)
    fitting.sort(key=lambda e: (e.step_time_s, e.memory.total_bytes))
    missing.sort(key=lambda e: e.memory.total_bytes)
    if not fitting:
        raise _infeasible(model, n_devices, machine, missing, pruned)
    return SearchResult(best=fitting[0], runners_up=tuple(fitting[1:keep]), closest_misses=tuple(missing[:3]),
                        evaluated=evaluated, pruned=dict(sorted(pruned.items())))


def _infeasible(model: ModelConfig, n_devices: int, machine: Machine, missing: list[StepEstimate], pruned: Counter[str]) -> InfeasibleError:
    if not missing:
        rules = ", ".join(f"{rule} ({count})" for rule, count in sorted(pruned.items()))
        return InfeasibleError(f"no layout of {model.name} on {n_devices} devices is consistent: {rules}",
                               fix="use a device count whose factors divide the heads, layers and batch")
    closest = missing[0]
    lay = closest.layout
    need, have = closest.memory.total_bytes / _GIB, machine.hbm_bytes / _GIB
    more = 2 ** math.ceil(math.log2(max(2.0, need / have))) * n_devices
    return InfeasibleError(
        f"{model.name} does not fit on {n_devices}× {machine.name}: the closest layout (dp{lay.dp} tp{lay.tp} pp{lay.pp} "
        f"mb{lay.micro_batch} {lay.recompute} recompute, ZeRO {lay.zero_stage}) needs {need:.1f} GiB per device, has {have:.0f} GiB",
        fix=f"use about {more} devices or hardware with more memory",
    )
