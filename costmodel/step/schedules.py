"""Pipeline schedules (GPipe, 1F1B, interleaved 1F1B) simulated as a timeline.

Each stage runs its schedule's ordered list of forward/backward micro-steps; a step starts
when its device is free and its input is ready (the neighbouring stage's step has ended).
Transfers between stages block: every micro-step of a chunk also sends or receives one
activation on its own device's timeline (Megatron-LM's synchronous send/recv pairs; a
``ppermute`` between the ticks of a loop), so they lengthen the steady state, not only
the fill and drain. The result is exact for the given per-stage times, including uneven
stages (embedding on the first, head on the last) and the bubble.

>>> t = simulate_pipeline(PipelineTimes(forward_s=(1.0,) * 4, backward_s=(2.0,) * 4, p2p_s=0.0),
...                       n_microbatches=8, schedule=Schedule.ONE_F_ONE_B)
>>> t.step_time_s, t.bubble_s  # (m + p - 1)·(f + b) and (p - 1)·(f + b)
(33.0, 9.0)
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveInt

from costmodel.errors import InvalidPlanError
from costmodel.inputs.layout import Schedule
from costmodel.step.lockstep import SplitOp, one_f_one_b_ticks, split_backward_op, split_backward_periods

_Step = tuple[bool, int, int]  # (is_forward, micro-batch, chunk)


class PipelineTimes(BaseModel):
    """Per-stage compute time of one micro-batch (all of a device's chunks together)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    forward_s: tuple[NonNegativeFloat, ...] = Field(description="Forward time per micro-batch, per stage.")
    backward_s: tuple[NonNegativeFloat, ...] = Field(description="Backward (incl. recompute) time per micro-batch, per stage.")
    p2p_s: NonNegativeFloat = Field(description="Transfer time of one activation between neighbouring stages, "
                                    "spent by each micro-step of a chunk when there is more than one stage.")
    interleave: PositiveInt = Field(1, description="Model chunks per device.")
    ends_forward_s: tuple[NonNegativeFloat, ...] = Field((), description="Of forward_s, per stage, what is not its layers' (the "
                                                         "embedding, the head); none when empty.")
    ends_backward_s: tuple[NonNegativeFloat, ...] = Field((), description="Of backward_s, per stage, what is not its layers'.")
    layers: tuple[PositiveInt, ...] = Field((), description="Layers per stage (empty: an even number each).")

    @property
    def transfer_s(self) -> float:
        """What one micro-step spends sending or receiving (nothing with a single stage)."""
        return self.p2p_s if len(self.forward_s) > 1 else 0.0

    @property
    def transfers_per_microbatch_s(self) -> float:
        """A device's transfers for one micro-batch: one per forward and one per backward of each chunk."""
        return 2 * self.interleave * self.transfer_s

    @property
    def per_stage_s(self) -> list[float]:
        """Each stage's time for one micro-batch: forward, backward and its transfers."""
        return [f + b + self.transfers_per_microbatch_s for f, b in zip(self.forward_s, self.backward_s)]


class TimelineEvent(BaseModel):
    """One micro-step on one stage, for plots."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stage: int
    forward: bool
    microbatch: int
    chunk: int
    start_s: float
    end_s: float


class PipelineResult(BaseModel):
    """Step time of the pipelined part of a step, its bubble, and the timeline."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step_time_s: float = Field(description="From the first forward to the last backward.")
    busy_s: float = Field(description="Compute time of the busiest stage.")
    bubble_s: float = Field(description="Idle time of the busiest stage (step_time_s - busy_s).")
    events: tuple[TimelineEvent, ...] = Field((), description="Every micro-step, when kept.")


def simulate_pipeline(
    times: PipelineTimes, *, n_microbatches: int, schedule: Schedule, keep_events: bool = False
) -> PipelineResult:
    """Simulate one step of ``schedule`` over ``len(times.forward_s)`` stages."""
    p, m, v = len(times.forward_s), n_microbatches, times.interleave
    if schedule is Schedule.INTERLEAVED and v > 1 and m % p:
        raise InvalidPlanError(
            f"interleaved schedule needs micro-batches ({m}) divisible by pipeline stages ({p})",
            fix="choose a micro-batch count that is a multiple of pp",
        )
    orders = [_stage_order(s, p, m, v, schedule) for s in range(p)]
    ends: dict[tuple[bool, int, int, int], float] = {}
    free_at, cursor, events = [0.0] * p, [0] * p, []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(p):
            while cursor[s] < len(orders[s]):
                fwd, mb, chunk = orders[s][cursor[s]]
                ready = _ready_time(ends, fwd, mb, chunk, s, p, v)
                if ready is None:
                    break
                start = max(free_at[s], ready)
                end = start + (times.forward_s[s] if fwd else times.backward_s[s]) / v + times.transfer_s
                ends[(fwd, mb, chunk, s)] = free_at[s] = end
                if keep_events:
                    events.append(TimelineEvent(stage=s, forward=fwd, microbatch=mb, chunk=chunk, start_s=start, end_s=end))
                cursor[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise InvalidPlanError(f"pipeline schedule {schedule} deadlocks for {p=} {m=} {v=}", fix="use schedule 1f1b")
    step = max(free_at)
    busy = [m * (f + b + times.transfers_per_microbatch_s) for f, b in zip(times.forward_s, times.backward_s)]
    busiest = max(range(p), key=lambda s: busy[s])
    return PipelineResult(step_time_s=step, busy_s=busy[busiest], bubble_s=step - busy[busiest], events=tuple(events))


def pipeline_step_estimate(times: PipelineTimes, *, n_microbatches: int, schedule: Schedule) -> PipelineResult:
    """Closed-form step time of ``schedule``, O(p) instead of the O(p·m·v) simulation.

    The slowest stage, transfers included, sets the pace of the steady state; filling and
    draining the pipeline costs every stage's time once, divided by the chunks per device.
    Exact for uniform stages (tested against `simulate_pipeline`); used by the planners,
    which cost thousands of layouts.

    >>> t = PipelineTimes(forward_s=(1.0,) * 4, backward_s=(2.0,) * 4, p2p_s=0.0)
    >>> pipeline_step_estimate(t, n_microbatches=8, schedule=Schedule.ONE_F_ONE_B).step_time_s
    33.0
    """
    m = n_microbatches
    v = times.interleave if schedule is Schedule.INTERLEAVED else 1
    per_stage = times.per_stage_s
    slowest = max(per_stage)
    step = (m - 1 / v) * slowest + sum(per_stage) / v
    return PipelineResult(step_time_s=step, busy_s=m * slowest, bubble_s=step - m * slowest)


def _ready_time(ends: dict[tuple[bool, int, int, int], float], fwd: bool, mb: int, chunk: int, s: int, p: int, v: int) -> float | None:
    """When the input of a micro-step is ready, or None if its producer has not run."""
    if fwd:
        if s > 0:
            dep = (True, mb, chunk, s - 1)
        elif chunk > 0:
            dep = (True, mb, chunk - 1, p - 1)
        else:
            return 0.0
    elif s < p - 1:
        dep = (False, mb, chunk, s + 1)
    elif chunk < v - 1:
        dep = (False, mb, chunk + 1, 0)
    else:
        own = ends.get((True, mb, chunk, s))
        return own
    return ends.get(dep)


def _stage_order(s: int, p: int, m: int, v: int, schedule: Schedule) -> list[_Step]:
    """The order in which stage ``s`` runs its micro-steps."""
    if schedule is Schedule.GPIPE:
        fwd = [(True, mb, c) for c in range(v) for mb in range(m)]
        return fwd + [(False, mb, c) for c in reversed(range(v)) for mb in range(m)]
    forwards = [(True, *_interleaved_index(k, p, v, m, forward=True)) for k in range(m * v)]
    backwards = [(False, *_interleaved_index(k, p, v, m, forward=False)) for k in range(m * v)]
    if v == 1:
        warmup = min(p - s - 1, m)
    else:
        warmup = min((p - s - 1) * 2 + (v - 1) * p, m * v)
    order = forwards[:warmup]
    for k in range(m * v - warmup):
        order += [forwards[warmup + k], backwards[k]]
    return order + backwards[m * v - warmup:]


def _interleaved_index(k: int, p: int, v: int, m: int, *, forward: bool) -> tuple[int, int]:
    """(micro-batch, chunk) of a device's k-th forward or backward micro-step (Megatron's order)."""
    if v == 1:
        return k, 0
    group = k // (p * v)
    chunk = (k // p) % v
    return group * p + k % p, chunk if forward else v - 1 - chunk


def lockstep_step_estimate(times: PipelineTimes, *, n_microbatches: int, keep_events: bool = False) -> PipelineResult:
    """Step time of 1F1B run in lockstep (`costmodel.step.lockstep`). Without interleaving, the
    split-backward schedule (`split_backward_estimate`). Interleaved, every tick every device runs
    one chunk's forward and backward (bubble ticks too) at the pace of the slowest stage, and the head
    (`validate.one_f_one_b`).

    >>> t = PipelineTimes(forward_s=(1.0,) * 4, backward_s=(2.0,) * 4, p2p_s=0.0, interleave=2)
    >>> r = lockstep_step_estimate(t, n_microbatches=8)
    >>> r.step_time_s, r.bubble_s  # (m·v + (v + 1)·p − 2)·(f + b)/v
    (39.0, 15.0)
    """
    if times.interleave == 1:
        return split_backward_estimate(times, n_microbatches=n_microbatches, keep_events=keep_events)
    p, m, v = len(times.forward_s), n_microbatches, times.interleave
    ends_forward, ends_backward = times.ends_forward_s or (0.0,) * p, times.ends_backward_s or (0.0,) * p
    # Each tick: one chunk's layers forward and backward, its two hand-offs, and the head on every device;
    # the embedding runs outside the loop, once a micro-batch.
    chunk_s = max(f - ef + b - eb for f, ef, b, eb in zip(times.forward_s, ends_forward, times.backward_s, ends_backward)) / v
    tick_s = chunk_s + 2 * times.transfer_s + ends_forward[-1] + ends_backward[-1]
    step = one_f_one_b_ticks(m, p, v) * tick_s + m * (ends_forward[0] + ends_backward[0])
    slowest = max(times.per_stage_s)
    return PipelineResult(step_time_s=step, busy_s=m * slowest, bubble_s=step - m * slowest)


def split_backward_estimate(times: PipelineTimes, *, n_microbatches: int, keep_events: bool = False) -> PipelineResult:
    """Step time of the split-backward 1F1B (`validate.split_backward`): ``M + S − 1`` periods of
    three slots, each slot as long as the longest operation of any stage (its layers' forward, or
    the backward of its upper ``⌈n/2⌉`` layers) plus its two hand-offs, and after one slot of each
    period the head's forward and backward on every device; the embedding runs outside, once a
    micro-batch. Events: each stage's operations (`costmodel.step.lockstep.split_backward_op`).

    >>> t = PipelineTimes(forward_s=(1.0,) * 4, backward_s=(2.0,) * 4, p2p_s=0.0)
    >>> r = split_backward_estimate(t, n_microbatches=8)
    >>> r.step_time_s, r.bubble_s  # (m + p − 1)·(f + b), as asynchronous 1F1B
    (33.0, 9.0)
    """
    p, m = len(times.forward_s), n_microbatches
    ends_forward, ends_backward = times.ends_forward_s or (0.0,) * p, times.ends_backward_s or (0.0,) * p
    layers = times.layers or (2,) * p
    forward = [f - e for f, e in zip(times.forward_s, ends_forward)]
    upper = [(b - e) * ((n + 1) // 2) / n for b, e, n in zip(times.backward_s, ends_backward, layers)]
    slot_s = max(max(f, b) for f, b in zip(forward, upper)) + 2 * times.transfer_s
    head_s = ends_forward[-1] + ends_backward[-1] if p > 1 else 0.0
    period_s = 3 * slot_s + head_s
    step = split_backward_periods(m, p) * period_s + m * (ends_forward[0] + ends_backward[0])
    slowest = max(times.per_stage_s)
    events = []
    if keep_events:
        head_slot = (p - 1) % 3
        for t in range(3 * split_backward_periods(m, p)):
            start = t // 3 * period_s + t % 3 * slot_s + (head_s if t % 3 > head_slot else 0.0)
            for d in range(p):
                op, mb = split_backward_op(t, d, p, m)
                if mb is not None:
                    busy_s = forward[d] if op is SplitOp.FORWARD else upper[d] if op is SplitOp.BACKWARD_HIGH else \
                        times.backward_s[d] - ends_backward[d] - upper[d]
                    events.append(TimelineEvent(stage=d, forward=op is SplitOp.FORWARD, microbatch=mb, chunk=0, start_s=start,
                                                end_s=start + busy_s))
    return PipelineResult(step_time_s=step, busy_s=m * slowest, bubble_s=step - m * slowest, events=tuple(events))
