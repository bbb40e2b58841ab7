"""Tests `costmodel/step/schedules.py`: schedules against their closed-form bubbles."""

import pytest

from costmodel.errors import InvalidPlanError
from costmodel.inputs.layout import Schedule
from costmodel.step.schedules import PipelineTimes, lockstep_step_estimate, pipeline_step_estimate, simulate_pipeline


def _times(p, *, f=1.0, b=2.0, p2p=0.0, v=1):
    return PipelineTimes(forward_s=(f,) * p, backward_s=(b,) * p, p2p_s=p2p, interleave=v)


@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ONE_F_ONE_B])
@pytest.mark.parametrize(("p", "m"), [(1, 4), (2, 2), (4, 8), (8, 32)])
def test_bubble_is_p_minus_one_microbatch_times(schedule, p, m):
    r = simulate_pipeline(_times(p), n_microbatches=m, schedule=schedule)
    assert r.step_time_s == pytest.approx((m + p - 1) * 3.0)
    assert r.bubble_s == pytest.approx((p - 1) * 3.0)


@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 4), (4, 2, 8), (4, 4, 16), (8, 3, 16)])
def test_interleaving_divides_the_bubble_by_chunks(p, v, m):
    r = simulate_pipeline(_times(p, v=v), n_microbatches=m, schedule=Schedule.INTERLEAVED)
    assert r.bubble_s == pytest.approx((p - 1) * 3.0 / v)
    assert r.busy_s == pytest.approx(m * 3.0)


@pytest.mark.parametrize(("schedule", "v"), [(Schedule.ONE_F_ONE_B, 1), (Schedule.INTERLEAVED, 2)])
def test_blocking_transfers_lengthen_every_microstep(schedule, v):
    slow = simulate_pipeline(_times(4, p2p=0.1, v=v), n_microbatches=8, schedule=schedule)
    assert slow.step_time_s == pytest.approx((8 + 3 / v) * (3.0 + 2 * v * 0.1))
    assert slow.busy_s == pytest.approx(8 * (3.0 + 2 * v * 0.1))


def test_one_stage_sends_nothing():
    r = simulate_pipeline(_times(1, p2p=0.1), n_microbatches=8, schedule=Schedule.ONE_F_ONE_B)
    assert r.step_time_s == pytest.approx(8 * 3.0)


def test_slowest_stage_sets_the_pace():
    times = PipelineTimes(forward_s=(1.0, 1.0, 1.5), backward_s=(2.0, 2.0, 3.0), p2p_s=0.0)
    r = simulate_pipeline(times, n_microbatches=16, schedule=Schedule.ONE_F_ONE_B)
    assert r.busy_s == pytest.approx(16 * 4.5)
    assert r.step_time_s >= 16 * 4.5 + 2 * 3.0


def test_events_cover_every_microstep_without_overlap():
    r = simulate_pipeline(_times(3, v=2), n_microbatches=6, schedule=Schedule.INTERLEAVED, keep_events=True)
    assert len(r.events) == 3 * 6 * 2 * 2
    for stage in range(3):
        spans = sorted((e.start_s, e.end_s) for e in r.events if e.stage == stage)
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(spans, spans[1:]))


def test_interleaving_needs_divisible_microbatches():
    with pytest.raises(InvalidPlanError, match="divisible by pipeline stages"):
        simulate_pipeline(_times(4, v=2), n_microbatches=6, schedule=Schedule.INTERLEAVED)


@pytest.mark.parametrize(("forward", "backward", "p2p", "v", "m", "schedule"), [
    ((1.0,) * 4, (2.0,) * 4, 0.0, 1, 8, Schedule.ONE_F_ONE_B),
    ((1.0,) * 8, (2.0,) * 8, 0.0, 3, 16, Schedule.INTERLEAVED),
    ((1.2, 1.0, 1.0, 1.5), (2.4, 2.0, 2.0, 3.1), 0.01, 1, 16, Schedule.ONE_F_ONE_B),
    ((1.2, 1.0, 1.0, 1.5), (2.4, 2.0, 2.0, 3.1), 0.01, 2, 16, Schedule.INTERLEAVED),
    ((1.0,) * 8, (2.0,) * 8, 0.05, 1, 4, Schedule.GPIPE),
])
def test_closed_form_agrees_with_the_simulated_timeline(forward, backward, p2p, v, m, schedule):
    times = PipelineTimes(forward_s=forward, backward_s=backward, p2p_s=p2p, interleave=v)
    simulated = simulate_pipeline(times, n_microbatches=m, schedule=schedule)
    closed = pipeline_step_estimate(times, n_microbatches=m, schedule=schedule)
    assert closed.step_time_s == pytest.approx(simulated.step_time_s, rel=1e-9)
    assert closed.bubble_s == pytest.approx(simulated.bubble_s, rel=1e-9, abs=1e-9)


def test_lockstep_with_a_split_backward_pays_the_async_bubble_and_places_each_operation():
    times = PipelineTimes(forward_s=(1.0,) * 4, backward_s=(2.0,) * 4, p2p_s=0.0)
    lockstep = lockstep_step_estimate(times, n_microbatches=8, keep_events=True)
    async_1f1b = pipeline_step_estimate(times, n_microbatches=8, schedule=Schedule.ONE_F_ONE_B)
    assert lockstep.step_time_s == pytest.approx(async_1f1b.step_time_s) and lockstep.busy_s == async_1f1b.busy_s
    backward = sorted((e.start_s, e.end_s) for e in lockstep.events if not e.forward and e.stage == 0 and e.microbatch == 7)
    assert backward[-1][1] == pytest.approx(lockstep.step_time_s)  # stage 0's last backward half ends the step
    forward = {(e.stage, e.microbatch): e for e in lockstep.events if e.forward}
    assert forward[(3, 0)].start_s == pytest.approx(3.0)  # slot 3 (one slot: a forward, half a backward)
    assert len(lockstep.events) == 4 * 8 * 3


def test_lockstep_slots_wait_for_the_longer_backward_half_and_the_head():
    # Three layers a stage: the upper half's backward is two layers' (4/3 s); the last stage's 0.5 s head runs every period.
    times = PipelineTimes(forward_s=(1.0, 1.25), backward_s=(2.0, 2.25), p2p_s=0.0, layers=(3, 3), ends_forward_s=(0.0, 0.25),
                          ends_backward_s=(0.0, 0.25))
    r = lockstep_step_estimate(times, n_microbatches=4)
    assert r.step_time_s == pytest.approx((4 + 1) * (3 * 4 / 3 + 0.5))


def test_interleaved_lockstep_ticks_run_every_chunk_through_the_bubble():
    times = PipelineTimes(forward_s=(1.0,) * 4, backward_s=(2.0,) * 4, p2p_s=0.0, interleave=2)
    r = lockstep_step_estimate(times, n_microbatches=8)
    assert r.step_time_s == pytest.approx((8 * 2 + 3 * 4 - 2) * 1.5) and r.busy_s == pytest.approx(24.0)
    # The head (0.5 s, the last stage's) runs whole every tick on every device, not a chunk's share of it.
    with_head = times.model_copy(update={"forward_s": (1.0,) * 3 + (1.25,), "backward_s": (2.0,) * 3 + (2.25,),
                                         "ends_forward_s": (0.0,) * 3 + (0.25,), "ends_backward_s": (0.0,) * 3 + (0.25,)})
    assert lockstep_step_estimate(with_head, n_microbatches=8).step_time_s == pytest.approx(26 * (1.5 + 0.5))
