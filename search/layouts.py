"""Outer-knob layout search: enumerate layouts for a device count or mesh, prune, cost each.

Candidates are generated in a sorted, deterministic order over the knobs Megatron users
tune by hand — data, tensor, pipeline and context parallel degrees, micro-batch size,
activation recompute, sequence parallelism and ZeRO stage — and pruned by named
predicates (divisibility, tensor parallelism inside a node, memory). Every survivor is
costed by the one step simulator. A time limit stops the search in that order; the
result then says so (``complete``) and keeps the best layout costed so far.

>>> from costmodel.hardware.machine import load_machine
>>> from costmodel.inputs.model_config import ModelConfig
>>> m = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, ffn_size=4096, vocab_size=32000)
>>> result = grid_search(m, TrainConfig(seq_len=1024, global_batch=32), load_machine("a100-80gb"), n_devices=8)
>>> result.best.layout.n_devices, result.evaluated > 1
(8, True)
"""

from __future__ import annotations

import itertools
import math
import re
import time
from collections import Counter
from typing import Callable, Iterator

from pydantic import BaseModel, ConfigDict, Field

from costmodel.errors import InfeasibleError, PlannerError, TimeLimitError
from costmodel.hardware.machine import Machine
from costmodel.inputs.layout import Layout, Offload, Recompute, Schedule, check_layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.estimate import StepEstimate
from costmodel.step.kernels import lowers_local_gradients
from costmodel.step.simulator import balanced_layout, simulate

_GIB = 2**30
# The validator pads uneven stages and moves layers between them every step (`validate.gpipe`),
# traffic a program storing each stage's own layers would not have; it lowers equal interleaved chunks only.
UNEVEN_RULE = "uneven stages are not lowered as planned yet"
# XLA aborts on the embedding and head run whole per pipeline group (`validate.gpipe`).
PIPELINE_ZERO3_TP_RULE = "pipelines with ZeRO-3 and tensor parallelism are not lowered as planned yet"
# The experts' tensor-parallel region (`validate.mesh_hooks.expert_region`) does not nest in a stage.
PIPELINE_MOE_TP_RULE = "pipelines of MoE layers with tensor parallelism are not lowered as planned yet"
# XLA splits a whole head's weight gradient over the data and tensor axes (with permutes) there.
UNSPLIT_VOCAB_ZERO_TP_RULE = "ZeRO with tensor parallelism over a vocabulary it does not divide is not lowered as planned yet"
# There the program reduces inside its loop and keeps no split accumulator (`costmodel.step.kernels.lowers_local_gradients`).
ZERO2_IN_LOOP_RULE = ("ZeRO-2 beside context, expert or pipeline axes, beside tensor axes in an MoE model, under LoRA or in an "
                      "intra-op program is not lowered as planned yet")
LORA_PIPELINE_RULE = "LoRA with pipeline stages is not lowered to JAX yet"
# `validate.intraop_program` pins an intra-op choice in a program without stages; a pipeline would lower by the Megatron rules.
INTRA_OP_PIPELINE_RULE = "intra-op (ILP, search) shardings inside pipeline stages are not lowered as chosen yet"
# Inside pipeline stages XLA partitions a sequence-split activation with extra resharding
# (all-to-alls, permutes across both axes) the plan does not have.
SP_PIPELINE_RULE = "sequence parallelism inside pipeline stages is not lowered as planned yet"
# The experts' region (`validate.mesh_hooks.expert_region`) does not nest in a stage, a LoRA step or an intra-op program.
EXPERT_LOWERING_RULE = "expert parallelism with pipeline stages, LoRA or intra-op shardings is not lowered yet"
EXPERT_CP_RULE = "expert parallelism beside context parallelism is not planned yet"
# Pieces the planner cuts the loss into when nothing fits whole (torchtune's chunked output loss: 8).
LOSS_PIECES = 8
# ZeRO's shards split the weights' width (`planner.shardings`): a degree that divides no dimension leaves them whole.
ZERO_WIDTH_RULE = "ZeRO over a data-parallel degree that does not divide the model width is not lowered as planned yet"
SP_TP_RULE = "sequence parallelism needs tp > 1"
TIME_LIMIT_RULE = "not costed: time limit reached"
MICRO_BATCHES = (1, 2, 4, 8)
# With the step in backward each replica's whole batch is its one micro-batch; the other sizes are not tried.
ONE_MICRO_BATCH_RULE = "the optimizer step in backward runs one micro-batch a step"
RECOMPUTE = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)


class SearchSpace(BaseModel):
    """Which values each knob may take (the software facts are fixed, not searched)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    micro_batches: tuple[int, ...] = Field(MICRO_BATCHES, description="Micro-batch sizes tried.")
    recompute: tuple[Recompute, ...] = Field(RECOMPUTE, description="Recompute policies tried.")
    zero_stages: tuple[int, ...] = Field((0, 1, 2, 3), description="ZeRO stages tried.")
    interleaves: tuple[int, ...] = Field((1, 2, 3, 4), description="Model chunks per pipeline device tried (pp > 1).")
    max_cp: int = Field(1, description="Largest context-parallel degree tried.")
    expert_degrees: tuple[int, ...] | None = Field(
        None, description="Expert-parallel degrees tried on an MoE model (a mesh fixes it: its expert axes); None: every "
        "divisor of the expert count that divides the data-parallel degree. Dense models take 1.")
    splits: tuple[tuple[int, int, int, int], ...] | None = Field(
        None, description="Allowed (dp, tp, pp, cp) degrees, e.g. those a fixed mesh can carry; None = every split."
    )
    sequence_parallel: bool | None = Field(None, description="Megatron sequence parallelism on every candidate (True: layouts "
                                           "without tp > 1 are dropped), on none (False), or None: wherever tp > 1 (with "
                                           "lowered_only, outside pipeline stages).")
    stack: Layout = Field(default_factory=Layout, description="The software stack every candidate runs: each Layout field "
                          "the search does not set (attention kernel, overlap, kernel fusion, recompute depth, ...) comes from it.")
    offload_when_nothing_fits: bool = Field(
        False, description="When no layout fits in device memory, search again with the optimizer state offloaded to the host, "
        "then with every ZeRO-3 shard there (`costmodel.step.offload`; needs a cluster whose host is described); the "
        "stack's own offload setting otherwise.")
    loss_pieces_when_nothing_fits: bool = Field(
        False, description=f"When no layout fits in device memory, search again with the loss in {LOSS_PIECES} pieces "
        "(`SoftwareStack.cross_entropy_chunks`: one piece's logits at a time), before offloading.")
    uneven_stages: bool = Field(True, description="Also try each pipelined layout with layers cut into stages by the inter-op DP.")
    intra_op: bool = Field(False, description="An intra-op planner (ILP or search) shards each op of the chosen layout; "
                           "with lowered_only, pipelined layouts are dropped, as the validator lowers such choices without stages.")
    lowered_only: bool = Field(False, description="Only layouts the validator lowers to the program they describe (no "
                               "uneven stages or interleaved chunks, no sequence parallelism inside pipeline stages, no ZeRO-3 and no MoE "
                               "layers with tensor parallelism inside pipelines, no LoRA or intra-op shardings with pipeline stages, "
                               "no ZeRO with tensor parallelism over a vocabulary it does not divide yet), so that every plan "
                               "emitted can be compiled and checked.")


class SearchResult(BaseModel):
    """The best layout, the runners-up, and what was evaluated and pruned."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    best: StepEstimate = Field(description="Fastest layout that fits.")
    runners_up: tuple[StepEstimate, ...] = Field(description="Next fastest fitting layouts, fastest first.")
    closest_misses: tuple[StepEstimate, ...] = Field(description="Layouts that did not fit, least over first, one per degree split.")
    evaluated: int = Field(description="Candidates costed by the simulator.")
    pruned: dict[str, int] = Field(description="Candidates dropped before simulation, by rule.")
    offload_reason: str | None = Field(None, description="Why the layouts offload, when the search chose to (nothing fit without).")
    loss_pieces_reason: str | None = Field(None, description="Why the layouts run the loss in pieces, when the search chose to "
                                           "(nothing fit with it whole).")

    @property
    def complete(self) -> bool:
        """Whether every candidate was costed or pruned (the time limit did not stop the search)."""
        return TIME_LIMIT_RULE not in self.pruned


class NothingFitsError(InfeasibleError):
    """No layout fits in memory (not a time limit, not a rule): the closest misses, nearest first."""

    def __init__(self, cause: str, *, fix: str, closest: list[StepEstimate]) -> None:
        super().__init__(cause, fix=fix)
        self.closest = closest


def divisors(n: int) -> list[int]:
    """Divisors of ``n`` in increasing order, in O(sqrt(n)) steps.

    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]
    """
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def degree_splits(n_devices: int, *, max_cp: int = 1) -> Iterator[tuple[int, int, int, int]]:
    """(dp, tp, pp, cp) with product ``n_devices``, sorted.

    >>> list(degree_splits(4))
    [(1, 1, 4, 1), (1, 2, 2, 1), (1, 4, 1, 1), (2, 1, 2, 1), (2, 2, 1, 1), (4, 1, 1, 1)]
    """
    ds = divisors(n_devices)
    splits = [(dp, tp, n_devices // (dp * tp * cp), cp)
              for dp, tp, cp in itertools.product(ds, ds, [d for d in ds if d <= max_cp])
              if n_devices % (dp * tp * cp) == 0]
    yield from sorted(splits)


def tensor_parallel_in_node(layout: Layout, devices_per_node: int) -> bool:
    """Tensor parallelism stays on the fast intra-node link (Megatron's rule of thumb)."""
    return layout.tp <= devices_per_node


def _knobs(model: ModelConfig, n_devices: int, space: SearchSpace) -> tuple[tuple, ...]:
    """The value lists whose product is the raw candidate set, splits first."""
    splits = space.splits if space.splits is not None else tuple(degree_splits(n_devices, max_cp=space.max_cp))
    experts = (1,) if not model.is_moe else space.expert_degrees or tuple(divisors(model.num_experts))
    return splits, experts, space.micro_batches, space.recompute, space.zero_stages, space.interleaves


def candidate_layouts(model: ModelConfig, train: TrainConfig, n_devices: int, space: SearchSpace, pruned: Counter[str], *,
                      devices_per_node: int, deadline_s: float = math.inf) -> Iterator[Layout]:
    """Consistent layouts in a deterministic order; counts what it drops in ``pruned``.

    Once ``time.perf_counter()`` passes ``deadline_s`` it stops, counting the candidates
    left under `TIME_LIMIT_RULE`.
    """
    knobs = _knobs(model, n_devices, space)
    total = math.prod(len(k) for k in knobs)
    stack = space.stack.model_dump()
    for i, ((dp, tp, pp, cp), ep, mb, recompute, zero, v) in enumerate(itertools.product(*knobs)):
        if time.perf_counter() > deadline_s:
            pruned[TIME_LIMIT_RULE] += total - i
            return
        if dp % ep:
            pruned["expert parallelism not dividing data parallelism"] += 1
            continue
        if ep > 1 and cp > 1:
            pruned[EXPERT_CP_RULE] += 1
            continue
        if ep > 1 and (pp > 1 or space.intra_op or not train.workload.trains_base_weights) and space.lowered_only:
            pruned[EXPERT_LOWERING_RULE] += 1
            continue
        if zero > 0 and dp == 1:
            pruned["ZeRO without data parallelism"] += 1
            continue
        if train.optimizer_in_backward and len(space.micro_batches) > 1:  # one micro-batch a step: the replica's batch
            if mb != space.micro_batches[0]:
                pruned[ONE_MICRO_BATCH_RULE] += 1
                continue
            mb = max(1, train.global_batch // dp)
        if v > 1 and (pp == 1 or (train.global_batch // (dp * mb)) % pp):
            pruned["interleaving needs pp > 1 and micro-batches divisible by pp"] += 1
            continue
        if pp > 1 and model.num_layers % (pp * v) and space.lowered_only:
            pruned[UNEVEN_RULE] += 1
            continue
        if zero == 2 and space.lowered_only and (space.intra_op or not lowers_local_gradients(
                model, train, space.stack.model_copy(update={"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep, "zero_stage": zero}))):
            pruned[ZERO2_IN_LOOP_RULE] += 1
            continue
        if pp > 1 and tp > 1 and zero >= 3 and space.lowered_only:
            pruned[PIPELINE_ZERO3_TP_RULE] += 1
            continue
        if pp > 1 and tp > 1 and model.is_moe and space.lowered_only:
            pruned[PIPELINE_MOE_TP_RULE] += 1
            continue
        if pp > 1 and not train.workload.pipeline_lowered and space.lowered_only:
            pruned[LORA_PIPELINE_RULE] += 1
            continue
        if pp > 1 and space.intra_op and space.lowered_only:
            pruned[INTRA_OP_PIPELINE_RULE] += 1
            continue
        if zero >= 1 and model.hidden_size % dp and space.lowered_only:
            pruned[ZERO_WIDTH_RULE] += 1
            continue
        if tp > 1 and model.vocab_shards(tp) == 1 and zero >= 1 and space.lowered_only:
            pruned[UNSPLIT_VOCAB_ZERO_TP_RULE] += 1
            continue
        sequence_parallel = tp > 1 and not (pp > 1 and space.lowered_only)
        if space.sequence_parallel and not sequence_parallel:
            pruned[SP_TP_RULE if tp == 1 else SP_PIPELINE_RULE] += 1
            continue
        layout = Layout(**{
            **stack, "dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep, "micro_batch": mb, "recompute": recompute,
            "sequence_parallel": sequence_parallel and space.sequence_parallel is not False, "zero_stage": zero, "interleave": v,
            "schedule": Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B,
        })
        if not tensor_parallel_in_node(layout, devices_per_node):
            pruned["tensor parallel across nodes"] += 1
            continue
        try:
            check_layout(layout, model, train, n_devices=n_devices)
        except PlannerError as err:
            pruned[re.sub(r"\d+", "N", err.cause)] += 1  # the rule, without this candidate's numbers
            continue
        yield layout


def grid_search(model: ModelConfig, train: TrainConfig, machine: Machine, *, n_devices: int, space: SearchSpace | None = None,
                keep: int = 5, time_limit_s: float = math.inf, on_progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """Cost every candidate layout; the fastest that fits wins. When nothing fits in device memory
    they are costed again each way the space allows: with the loss in pieces
    (``space.loss_pieces_when_nothing_fits``), with the saved activations, the optimizer state or
    the parameters (ZeRO 3 only) on the host (``space.offload_when_nothing_fits``), each also with
    the loss in pieces; the fastest that fits wins, and the result says why
    (``loss_pieces_reason``, ``offload_reason``).

    Args:
      time_limit_s: wall seconds; when they run out the search stops and keeps the best
        layout costed so far (``result.complete`` is then False).
      on_progress: called as ``on_progress(done, total)`` after each costed candidate,
        counting raw candidates (pruned ones included).

    Raises:
      InfeasibleError: no candidate fits in memory (the message names the closest ones),
        no candidate is consistent with the model at all, or the time limit ran out first.
    """
    space = space or SearchSpace()
    start_s = time.perf_counter()
    try:
        return _search(model, train, machine, n_devices=n_devices, space=space, keep=keep, time_limit_s=time_limit_s,
                       on_progress=on_progress)
    except InfeasibleError as err:
        first_err = err
    # Nothing fits: every way to fit that the space allows is searched, and the fastest result kept.
    budget = f"nothing fits in {machine.memory_budget_bytes / _GIB:.1f} GiB per device (usable less the runtime reserve)"
    pieces_reason = {"loss_pieces_reason": f"{budget} with the loss over whole sequences"}
    offload_reason = {"offload_reason": f"{budget} without offloading"}
    pieces = _with_loss_pieces(space) if _may_cut_the_loss(train, space, first_err) else None
    # Saved activations on the host (torchtune's OffloadActivations), behind forward and backward.
    activations = (space.model_copy(update={"stack": space.stack.model_copy(update={"offload_activations": True})})
                   if _may_offload(train, machine, space, first_err, activations=True) else None)
    offloaded = _offloaded(space, Offload.OPTIMIZER) if _may_offload(train, machine, space, first_err) else None
    # Then every ZeRO-3 shard on the host (FSDP's CPU offload; shards need devices to spread over), the only
    # offload a fine-tuning run has here.
    params = (_offloaded(space, Offload.PARAMS) if n_devices > 1 and _may_offload(train, machine, space, first_err, Offload.PARAMS)
              else None)
    attempts = [(pieces, pieces_reason), (activations, offload_reason),
                (pieces and activations and _with_loss_pieces(activations), {**pieces_reason, **offload_reason}),
                (offloaded, offload_reason),
                (pieces and offloaded and _offloaded(pieces, Offload.OPTIMIZER), {**pieces_reason, **offload_reason}),
                (params, offload_reason), (pieces and params and _offloaded(pieces, Offload.PARAMS), {**pieces_reason, **offload_reason})]
    last_err, found = first_err, []
    for attempt, reasons in attempts:
        if attempt is None:
            continue
        try:
            result = _search(model, train, machine, n_devices=n_devices, space=attempt, keep=keep,
                             time_limit_s=time_limit_s - (time.perf_counter() - start_s), on_progress=on_progress)
        except NothingFitsError as err:
            last_err = err
            continue
        except InfeasibleError:
            # Pins that keep ZeRO 3 (parameter offload) or leave only pipelines (activation offload) leave no candidate.
            if attempt.stack.offload is Offload.PARAMS or attempt.stack.offload_activations:
                continue
            raise
        found.append(result.model_copy(update=reasons))
    if found:  # the fastest of what fits, whichever way
        return min(found, key=lambda r: r.best.step_time_s)
    closest_layout = last_err.closest[0].layout if isinstance(last_err, NothingFitsError) and last_err.closest else None
    if closest_layout is None or (closest_layout.offload is Offload.NONE and not closest_layout.offload_activations):
        raise last_err
    # Not even offloading helps: say what the offloaded layouts need too.
    closest = "; ".join(over_budget(e) for e in last_err.closest)
    what = {Offload.PARAMS: "the parameters", Offload.OPTIMIZER: "the optimizer state", Offload.NONE: "the activations"}[
        closest_layout.offload]
    raise NothingFitsError(f"{first_err.cause}; offloading {what}, closest: {closest}", fix=first_err.fix,
                           closest=last_err.closest)


def _with_loss_pieces(space: SearchSpace) -> SearchSpace:
    stack = space.stack.stack.model_copy(update={"cross_entropy_chunks": LOSS_PIECES})
    return space.model_copy(update={"stack": space.stack.model_copy(update={"stack": stack})})


def _offloaded(space: SearchSpace, offload: Offload) -> SearchSpace:
    return space.model_copy(update={"stack": space.stack.model_copy(update={"offload": offload})})


def _may_cut_the_loss(train: TrainConfig, space: SearchSpace, err: InfeasibleError) -> bool:
    """Whether a search that found nothing fitting should try again with the loss in pieces:
    memory was the cause, the planner may, the loss runs whole and the sequence divides."""
    return (space.loss_pieces_when_nothing_fits and space.stack.stack.cross_entropy_chunks == 1
            and train.seq_len % LOSS_PIECES == 0 and isinstance(err, NothingFitsError))


def _may_offload(train: TrainConfig, machine: Machine, space: SearchSpace, err: InfeasibleError,
                 offload: Offload = Offload.OPTIMIZER, *, activations: bool = False) -> bool:
    """Whether a search that found nothing fitting should try again with ``offload`` (or the saved
    ``activations``): memory was the cause, the planner may offload, the cluster has a host, and the
    workload is full training with fp32 state stepped after the backward (the optimizer state:
    ZeRO-Offload's CPU Adam), trains at all without the step in backward (the parameters), or
    trains at all (the activations, not offloaded already)."""
    if activations:
        trains = train.workload.runs_backward and not space.stack.offload_activations
    elif offload is Offload.OPTIMIZER:
        trains = train.workload.trains_base_weights and train.optimizer_state == "fp32" and not train.optimizer_in_backward
    else:
        trains = train.workload.runs_backward and not train.optimizer_in_backward
    return (space.offload_when_nothing_fits and space.stack.offload is Offload.NONE and machine.host is not None
            and trains and isinstance(err, NothingFitsError))


def _search(model: ModelConfig, train: TrainConfig, machine: Machine, *, n_devices: int, space: SearchSpace, keep: int,
            time_limit_s: float, on_progress: Callable[[int, int], None] | None) -> SearchResult:
    deadline_s = time.perf_counter() + time_limit_s
    total = math.prod(len(k) for k in _knobs(model, n_devices, space))
    pruned: Counter[str] = Counter()
    fitting, missing, evaluated, costed = [], [], 0, 0
    for layout in candidate_layouts(model, train, n_devices, space, pruned, devices_per_node=machine.devices_per_node,
                                    deadline_s=deadline_s):
        costed += 1
        if on_progress:
            on_progress(costed + sum(pruned.values()), total)
        variants = [layout]
        if space.uneven_stages:
            balanced = balanced_layout(model, train, layout, machine)
            if balanced.stage_layers and space.lowered_only:
                pruned[UNEVEN_RULE] += 1
            elif balanced.stage_layers:
                variants.append(balanced)
        for variant in variants:
            est = simulate(model, train, variant, machine)
            evaluated += 1
            (fitting if est.fits else missing).append(est)
    fitting.sort(key=lambda e: (e.step_time_s, e.memory.total_bytes))
    missing.sort(key=lambda e: e.memory.total_bytes)
    if not fitting:
        if TIME_LIMIT_RULE in pruned:
            raise TimeLimitError(f"the time limit of {time_limit_s:g} s ran out before a layout of {model.name} on {n_devices} "
                                  "devices that fits was found", fix="raise --time-limit-s, or give a --mesh (fewer layouts to cost)")
        raise _infeasible(model, train, n_devices, machine, missing, pruned)
    return SearchResult(best=fitting[0], runners_up=tuple(fitting[1:keep]), closest_misses=tuple(_closest_distinct(missing)),
                        evaluated=evaluated, pruned=dict(sorted(pruned.items())))


def _infeasible(model: ModelConfig, train: TrainConfig, n_devices: int, machine: Machine, missing: list[StepEstimate],
                pruned: Counter[str]) -> InfeasibleError:
    if not missing:
        rules = ", ".join(f"{rule} ({count})" for rule, count in sorted(pruned.items()))
        unlowered = PIPELINE_ZERO3_TP_RULE in pruned or PIPELINE_MOE_TP_RULE in pruned
        return InfeasibleError(
            f"no layout of {model.name} on {n_devices} devices is consistent: {rules}",
            fix=f"use a mesh or device count whose factors divide num_heads={model.num_heads}, num_layers={model.num_layers} "
                f"and global_batch={train.global_batch}" + (", or a mesh without a pipeline axis" if unlowered else ""),
        )
    more = 2 ** math.ceil(math.log2(max(2.0, missing[0].memory.total_bytes / machine.memory_budget_bytes))) * n_devices
    closest = _closest_distinct(missing)
    return NothingFitsError(
        f"{model.name} does not fit on {n_devices}× {machine.name}: every layout needs more than the "
        f"{missing[0].memory.limit_text()} per device; "
        f"closest: {'; '.join(over_budget(e) for e in closest)}",
        fix=f"use about {more} devices or hardware with more memory", closest=closest,
    )


def _closest_distinct(missing: list[StepEstimate], n: int = 3) -> list[StepEstimate]:
    """The ``n`` least-memory estimates with distinct (dp, tp, pp, cp) degrees; ``missing`` is sorted by memory."""
    seen, out = set(), []
    for e in missing:
        split = (e.layout.dp, e.layout.tp, e.layout.pp, e.layout.cp)
        if split not in seen:
            seen.add(split)
            out.append(e)
        if len(out) == n:
            break
    return out


def over_budget(e: StepEstimate) -> str:
    lay, mem = e.layout, e.memory
    state = (mem.params_bytes + mem.grads_bytes + mem.optimizer_bytes) / _GIB
    host = (f" and {mem.host.total_bytes / _GIB:.1f} GiB of host against its {mem.host.capacity_bytes / _GIB:.0f}"
            if mem.host and mem.host.capacity_bytes else "")
    return (f"dp{lay.dp} tp{lay.tp} pp{lay.pp} mb{lay.micro_batch} {lay.recompute} recompute ZeRO {lay.zero_stage} needs "
            f"{mem.total_bytes / _GIB:.1f} GiB (params+grads+optimizer {state:.1f}, "
            f"activations+temporaries {(mem.activations_bytes + mem.temporary_bytes) / _GIB:.1f}){host}")
