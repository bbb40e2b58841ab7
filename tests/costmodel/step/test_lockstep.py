"""Tests `costmodel/step/lockstep.py`: the split-backward 1F1B's slots, ring and periods."""

import pytest

from costmodel.inputs.layout import Layout
from costmodel.inputs.stack import STACKS
from costmodel.step.lockstep import SplitOp, in_flight_slots, runs_lockstep, split_backward_op, split_backward_periods


@pytest.mark.parametrize("stages, micro", [(1, 3), (2, 1), (2, 5), (3, 3), (4, 8), (5, 2), (6, 11)])
def test_every_operation_runs_once_a_slot_after_its_inputs_with_s_minus_s_in_flight(stages, micro):
    when = {}
    for slot in range(3 * split_backward_periods(micro, stages)):
        for s in range(stages):
            op, mb = split_backward_op(slot, s, stages, micro)
            if op is not SplitOp.IDLE:
                assert (op, mb, s) not in when
                when[op, mb, s] = slot
    assert len(when) == 3 * micro * stages  # every operation, and the last one ends the loop
    assert max(when.values()) == 3 * split_backward_periods(micro, stages) - 1
    for mb in range(micro):
        for s in range(stages):
            forward, high, low = (when[op, mb, s] for op in (SplitOp.FORWARD, SplitOp.BACKWARD_HIGH, SplitOp.BACKWARD_LOW))
            assert forward == (when[SplitOp.FORWARD, mb, s - 1] + 1 if s else forward)
            assert high == (when[SplitOp.BACKWARD_LOW, mb, s + 1] + 1 if s < stages - 1 else forward + 1)
            assert low == high + 1
    for s in range(stages):
        for slot in range(3 * split_backward_periods(micro, stages)):
            held = sum(when[SplitOp.FORWARD, mb, s] <= slot <= when[SplitOp.BACKWARD_LOW, mb, s] for mb in range(micro))
            assert held <= min(stages - s, micro)
    # A ring of min(S, M) slots: micro-batch m + S's forward comes after micro-batch m's last backward.
    assert all(when[SplitOp.FORWARD, mb + stages, s] > when[SplitOp.BACKWARD_LOW, mb, s]
               for mb in range(micro - stages) for s in range(stages))


def test_the_ring_holds_s_micro_batches_and_a_scratch_slot_interleaved_2vs_minus_1_chunks():
    assert in_flight_slots(4, 1, 32) == 5 and in_flight_slots(4, 1, 2) == 3
    assert in_flight_slots(4, 2, 32) == 15


def test_only_the_jax_stack_runs_pipelines_in_lockstep():
    assert runs_lockstep(Layout(pp=2)) and not runs_lockstep(Layout(pp=2, stack=STACKS["megatron-core"]))
    assert not runs_lockstep(Layout(pp=2, schedule="gpipe")) and not runs_lockstep(Layout())
