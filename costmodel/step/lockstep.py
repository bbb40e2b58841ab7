"""Pipelines as one SPMD program runs them: every device steps in lockstep.

One program on every device (what `plan validate` lowers for the ``jax`` stack) hands
activations on (and gradients back) between the steps of one loop, so a hand-off takes a whole
step. Without interleaving, `validate.split_backward` cuts each stage's backward in two by its
layers and runs one of three operations of about ``F`` a slot (`split_backward_op`): ``S − s``
micro-batches in flight on stage ``s`` (a ring of ``min(S, M)`` on every device, plus a scratch
slot) and ``3(M + S − 1)`` slots, Megatron's asynchronous 1F1B bubble. Interleaved
(`validate.one_f_one_b`), every tick runs one chunk's forward and backward on each device: a
micro-batch's gradient reaches device 0 ``2(v·S − 1) + 1`` ticks after its forward there, so
each device keeps ``2v·S − 1`` chunks of residuals, and runs ``M·v + (v + 1)·S − 2`` ticks,
bubbles included. (`costmodel.inputs.stack.SoftwareStack.lockstep_pipeline` says which
software runs pipelines so.)

>>> in_flight_slots(4, 1, 32), in_flight_slots(4, 2, 32), one_f_one_b_ticks(8, 4, 2)
(5, 15, 26)
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from costmodel.inputs.layout import Layout, Schedule
from costmodel.inputs.model_config import ModelConfig


def backward_lag_ticks(stages: int, chunks: int = 1) -> int:
    """Ticks between the last device's forward item ``w`` and its backward item ``w``
    (`validate.gpipe.work_item` order for both): the backward's first item of a round is its micro-batch's
    last chunk, which the forward reaches ``(v − 1)·S`` items into the round.

    >>> backward_lag_ticks(4), backward_lag_ticks(2, 4)
    (3, 7)
    """
    return (chunks - 1) * stages + stages - 1


def ring_slots(stages: int, chunks: int, micro_batches: int) -> int:
    """Slots of the residuals' ring for real work items: ``2v·S − 1`` (device 0's backward of its
    first chunk of a micro-batch comes ``2(v·S − 1)`` ticks after its forward), or all ``M·v``
    items where there are fewer.

    >>> ring_slots(4, 1, 32), ring_slots(2, 4, 16), ring_slots(2, 4, 2)
    (7, 15, 8)
    """
    return min(2 * chunks * stages - 1, micro_batches * chunks)


def interleaved_in_flight_slots(stages: int, chunks: int, micro_batches: int) -> int:
    """Chunks of residuals (micro-batches × chunks) every device keeps in the interleaved lockstep
    program (`K`): the ring, and where it holds every item, one more slot that bubble ticks write
    into (in a ring of ``2v·S − 1`` they write where no item in flight is).

    >>> interleaved_in_flight_slots(4, 1, 32), interleaved_in_flight_slots(2, 4, 2)
    (7, 9)
    """
    ring = ring_slots(stages, chunks, micro_batches)
    return ring + (ring < 2 * chunks * stages - 1)


def in_flight_slots(stages: int, chunks: int, micro_batches: int) -> int:
    """Chunks of residuals (micro-batches × chunks) every device of a lockstep pipeline keeps:
    without interleaving the split-backward ring and its scratch slot (`split_ring_slots`),
    interleaved `interleaved_in_flight_slots`.

    >>> in_flight_slots(4, 1, 32), in_flight_slots(4, 1, 2), in_flight_slots(2, 4, 2)
    (5, 3, 9)
    """
    if chunks == 1:
        return split_ring_slots(stages, micro_batches) + 1
    return interleaved_in_flight_slots(stages, chunks, micro_batches)


def one_f_one_b_ticks(micro_batches: int, stages: int, chunks: int = 1) -> int:
    """Ticks of the interleaved lockstep 1F1B loop (`validate.one_f_one_b`): the last backward item
    (device 0, item ``M·v − 1``) runs on tick
    ``M·v − 1 + lag + S − 1``; ``M + 2(S − 1)`` without interleaving.

    >>> one_f_one_b_ticks(8, 4), one_f_one_b_ticks(16, 2, 4)
    (14, 72)
    """
    return micro_batches * chunks + backward_lag_ticks(stages, chunks) + stages - 1


def gpipe_ticks(micro_batches: int, stages: int, chunks: int = 1) -> int:
    """Ticks of a GPipe loop (all forwards, then all backwards, each pass its own loop): ``M·v``
    items per device plus ``S − 1`` to fill the pipeline.

    >>> gpipe_ticks(8, 4), gpipe_ticks(16, 2, 4)
    (11, 65)
    """
    return micro_batches * chunks + stages - 1


def runs_lockstep(layout: Layout) -> bool:
    """Whether ``layout``'s pipeline runs in lockstep: pipelined, not GPipe, on a stack that does.

    >>> from costmodel.inputs.stack import STACKS
    >>> runs_lockstep(Layout(pp=2)), runs_lockstep(Layout(pp=2, stack=STACKS["megatron-core"])), runs_lockstep(Layout())
    (True, False, False)
    """
    return layout.pp > 1 and layout.stack.lockstep_pipeline and layout.schedule is not Schedule.GPIPE


def sums_gradients_locally(model: ModelConfig, layout: Layout) -> bool:
    """Whether a lockstep pipeline without interleaving sums each data replica's gradients on its own
    devices over the whole loop and reduces them over the data axes once after it
    (`validate.split_backward`, manual over the data axes too): all-reduced under ZeRO 0,
    reduce-scattered into the optimizer state's split under ZeRO 1 without tensor axes (beside automatic
    tensor axes XLA replicated such a reduce-scatter's operand over them, `validate.data_parallel_region`;
    not tried in the pipeline); dense models only (an
    MoE balancing loss is defined over a micro-batch's every sequence). Elsewhere the partitioner keeps
    reducing each layer's gradient as it is formed.

    >>> m = ModelConfig(name="m", hidden_size=64, num_layers=4, num_heads=4, ffn_size=128, vocab_size=256)
    >>> sums_gradients_locally(m, Layout(pp=2, dp=2, zero_stage=1)), sums_gradients_locally(m, Layout(pp=2, dp=2, zero_stage=2))
    (True, False)
    """
    return (runs_lockstep(layout) and layout.interleave == 1 and layout.dp > 1 and not model.is_moe
            and (layout.zero_stage == 0 or layout.zero_stage == 1 and layout.tp == 1))


class SplitOp(IntEnum):
    """What a stage runs in a slot of the split-backward 1F1B schedule (`split_backward_op`)."""

    FORWARD = 0
    BACKWARD_HIGH = 1  # the backward of the stage's upper ⌈n/2⌉ layers
    BACKWARD_LOW = 2  # the backward of the others
    IDLE = 3


def split_backward_op(slot: int, stage: int, stages: int, micro_batches: int) -> tuple[SplitOp, int | None]:
    """What stage ``stage`` runs in slot ``slot`` of 1F1B in lockstep with each stage's backward split
    in two by its layers (`validate.split_backward`), and on which micro-batch: ``F(m, s)`` at slot
    ``3m + s``, ``B_hi(m, s)`` at ``3m + 3S − 2 − 2s``, ``B_lo(m, s)`` right after. Modulo 3 these
    are ``s``, ``s + 1``, ``s + 2``: one operation a slot on every stage, each input made the slot
    before, and stage ``s`` holds ``S − s`` micro-batches, as Megatron's asynchronous 1F1B.

    >>> [split_backward_op(t, 1, 2, 2)[0].name for t in range(4)]
    ['IDLE', 'FORWARD', 'BACKWARD_HIGH', 'BACKWARD_LOW']
    """
    kind = SplitOp((slot - stage) % 3)
    mb = (slot - split_backward_start(kind, stage, stages)) // 3
    return (kind, mb) if 0 <= mb < micro_batches else (SplitOp.IDLE, None)


def split_backward_start(kind: Any, stage: Any, stages: int) -> Any:
    """The slot of micro-batch 0's operation ``kind`` (0: F, 1: B_hi, 2: B_lo) on ``stage``: ``s``,
    ``3S − 2 − 2s``, ``3S − 1 − 2s``. Arithmetic only, so integers and traced arrays alike
    (`validate.split_backward` runs it on the device's stage index).

    >>> [split_backward_start(k, 1, 4) for k in range(3)]
    [1, 8, 9]
    """
    return stage + (kind > 0) * (3 * stages - 3 - 3 * stage + kind)


def split_backward_periods(micro_batches: int, stages: int) -> int:
    """Periods of three slots in the split-backward schedule: the last operation, stage 0's
    ``B_lo`` of micro-batch ``M − 1``, runs in slot ``3(M + S − 1) − 1``.

    >>> split_backward_periods(8, 4)
    11
    """
    return micro_batches + stages - 1


def split_ring_slots(stages: int, micro_batches: int) -> int:
    """Micro-batches of residuals the split-backward schedule's ring holds: stage 0 keeps ``S``
    (``min(S, M)``); one more scratch slot takes the writes of the slots that run no forward.

    >>> split_ring_slots(4, 32), split_ring_slots(4, 2)
    (4, 2)
    """
    return min(stages, micro_batches)
