"""Tests `search/unstated.py`: unstated knobs chosen over what the stated layout can carry, stated parts kept."""

import pytest

from costmodel.errors import InvalidPlanError
from costmodel.hardware.machine import train_machine
from costmodel.hardware.registry import load_hardware
from costmodel.inputs.layout import Layout, Recompute
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import STACKS
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.simulator import simulate
from search.unstated import candidates, choose_unstated

LLAMA3_8B = ModelConfig(name="llama3-8b", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, ffn_size=14336,
                        vocab_size=128256)
LLAMA3_70B = ModelConfig(name="llama3-70b", hidden_size=8192, num_layers=80, num_heads=64, num_kv_heads=8, ffn_size=28672,
                         vocab_size=128256)
SMALL = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, ffn_size=4096, vocab_size=32000)


def _machine(train):
    return train_machine(load_hardware("h100-sxm"), train)


def test_candidates_follow_what_the_stated_layout_can_carry():
    train = TrainConfig(global_batch=48)
    assert candidates(SMALL, train, Layout(dp=4), "micro_batch") == [1, 2, 3, 4, 6, 12]
    assert candidates(SMALL, train, Layout(dp=4), "interleave") == [1]
    assert candidates(SMALL, train, Layout(dp=2, pp=2), "interleave") == [1, 2, 4]
    assert candidates(SMALL, train, Layout(dp=4), "sequence_parallel") == [False]
    assert candidates(SMALL, train, Layout(stack=STACKS["torchtitan"]), "recompute") == [
        Recompute.NONE, Recompute.SELECTIVE_OP, Recompute.FULL]


def test_the_choice_is_the_fastest_fitting_layout_and_keeps_the_stated_parts():
    train = TrainConfig(global_batch=64, seq_len=4096)
    stated = Layout(dp=2, tp=4, zero_stage=1, recompute="selective")
    machine = _machine(train)
    model = LLAMA3_8B
    choice = choose_unstated(model, train, stated, machine, unstated=("micro_batch",))
    tried = [simulate(model, train, stated.model_copy(update={"micro_batch": mb}), machine) for mb in (1, 2, 4, 8, 16, 32)]
    assert choice.fits and choice.estimate.step_time_s == min(e.step_time_s for e in tried if e.fits is not False)
    assert (choice.layout.tp, choice.layout.zero_stage, choice.layout.recompute) == (4, 1, Recompute.SELECTIVE)
    assert choice.chosen == {"micro_batch": choice.layout.micro_batch} and choice.evaluated == 6


def test_when_nothing_fits_the_least_memory_is_chosen_and_said():
    train = TrainConfig(global_batch=8, seq_len=8192)
    model = LLAMA3_70B
    choice = choose_unstated(model, train, Layout(dp=8), _machine(train), unstated=("micro_batch", "recompute"))
    assert not choice.fits and choice.chosen == {"micro_batch": 1, "recompute": Recompute.FULL}


def test_a_batch_the_replicas_cannot_share_is_refused_in_one_line():
    with pytest.raises(InvalidPlanError, match="no micro-batch divides 10 sequences over dp 4"):
        choose_unstated(SMALL, TrainConfig(global_batch=10), Layout(dp=4), _machine(TrainConfig(global_batch=10)),
                        unstated=("micro_batch",))
