"""Tests `costmodel/step/run_overheads.py`: checkpoint and input-pipeline time against hand arithmetic."""

import math

import pytest

from costmodel.hardware.storage import StorageSpec
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.run_overheads import RunOverheads, RunSettings, run_overheads

_SLOW_DISK = StorageSpec(read_bytes_per_s_per_device=1e6, write_bytes_per_s_per_device=1e9, assumed=True, source="test")


def _run(**kw):
    args = dict(tokens=1e9, tokens_per_step=1_000_000, step_time_s=2.0, n_devices=4, trained_params=1e9,
                train=TrainConfig(), vocab_size=32_000, storage=_SLOW_DISK)
    return run_overheads(**(args | kw))


def test_checkpoints_are_master_weights_and_two_moments_written_every_interval():
    run = _run(settings=RunSettings(checkpoint_every_s=100))
    # 1000 steps × 2 s = 2000 s of steps; the loader (1e6 tokens × 2 B / 4e6 B/s = 0.5 s) hides behind each 2 s step.
    assert run.steps_s == pytest.approx(2000) and run.input_overhead_s == 0
    assert run.checkpoint_bytes == pytest.approx(12e9) and run.checkpoint_write_s == pytest.approx(12e9 / 4e9)
    assert run.n_checkpoints == 20 and run.checkpoint_overhead_s == pytest.approx(20 * 3.0)
    assert run.total_s == pytest.approx(2000 + 60)


def test_a_prefetching_loader_adds_only_what_exceeds_the_step_and_a_blocking_one_adds_all():
    # 1e6 tokens × 4 B (vocabulary over 65 500) / 4e6 B/s = 1 s of reading per 0.25 s step.
    fast = dict(step_time_s=0.25, vocab_size=128_256)
    prefetch = _run(**fast)
    blocking = _run(**fast, settings=RunSettings(loader_prefetch=False))
    assert prefetch.token_bytes == 4 and prefetch.input_bytes_per_s == pytest.approx(16e6)
    assert prefetch.input_overhead_s == pytest.approx(1000 * 0.75) and blocking.input_overhead_s == pytest.approx(1000 * 1.0)


def test_no_checkpoint_before_the_first_interval_ends():
    assert _run(settings=RunSettings(checkpoint_every_s=1e9)).checkpoint_overhead_s == 0


def test_an_overheads_record_reads_back_from_json():
    run = _run()
    assert RunOverheads.model_validate_json(run.model_dump_json()) == run and math.isfinite(run.total_s)


def test_a_checkpoint_holds_the_weights_and_moments_as_the_optimizer_stores_them():
    from costmodel.step.run_overheads import checkpoint_bytes
    assert [checkpoint_bytes(1e9, TrainConfig(optimizer_state=s)) / 1e9 for s in ("fp32", "bf16")] == [12.0, 6.0]
