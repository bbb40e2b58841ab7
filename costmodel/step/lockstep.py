"""The 1F1B schedule as one SPMD program runs it: every device steps in lockstep.

One program on every device (`validate.one_f_one_b`, what `plan validate` lowers for the
``jax`` stack) runs one forward and one backward work item per tick on each device, and
hands activations on (and gradients back) between ticks. A hand-off therefore takes a whole
tick, so a micro-batch's gradient reaches device 0 ``2(S − 1) + 1`` ticks after its forward
there: each device keeps ``2S − 1`` micro-batches of residuals (``2v·S − 1`` chunks
interleaved), where Megatron's asynchronous 1F1B, whose stages alternate forward and backward
half a step apart, keeps ``S − s`` on stage ``s``. Every device also computes in every tick,
bubbles included: ``M·v + (v + 1)·S − 2`` ticks of one chunk's forward and backward.
(`costmodel.inputs.stack.SoftwareStack.lockstep_pipeline` says which software runs pipelines so.)

>>> in_flight_slots(4, 1, 32), one_f_one_b_ticks(8, 4)
(7, 14)
"""

from __future__ import annotations

from costmodel.inputs.layout import Layout, Schedule


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


def in_flight_slots(stages: int, chunks: int, micro_batches: int) -> int:
    """Chunks of residuals (micro-batches × chunks) every device keeps (`K`): the ring, and where
    it holds every item, one more slot that bubble ticks write into (in a ring of ``2v·S − 1``
    they write where no item in flight is).

    >>> in_flight_slots(4, 1, 32), in_flight_slots(2, 4, 2)
    (7, 9)
    """
    ring = ring_slots(stages, chunks, micro_batches)
    return ring + (ring < 2 * chunks * stages - 1)


def one_f_one_b_ticks(micro_batches: int, stages: int, chunks: int = 1) -> int:
    """Ticks of the 1F1B loop: the last backward item (device 0, item ``M·v − 1``) runs on tick
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
