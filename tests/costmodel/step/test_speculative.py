"""Tests `costmodel/step/speculative.py`: the expected accepted tokens and the step's cost."""

import random

import pytest

from costmodel.hardware.machine import load_machine
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.inference import iteration_s
from costmodel.step.speculative import Speculation, expected_tokens_per_step, speculative_step_s

TARGET = ModelConfig(name="t", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, ffn_size=14336, vocab_size=32000)
DRAFT = ModelConfig(name="d", hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=4, ffn_size=4096, vocab_size=32000)


@pytest.mark.parametrize("alpha, k", [(0.5, 3), (0.8, 4), (0.95, 7)])
def test_the_expected_tokens_are_what_independent_acceptances_give(alpha, k):
    rng = random.Random(0)

    def one_step() -> int:
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        return accepted + 1  # the target's own token

    mean = sum(one_step() for _ in range(200_000)) / 200_000
    assert expected_tokens_per_step(acceptance_rate=alpha, draft_tokens=k) == pytest.approx(mean, rel=0.01)


def test_a_step_costs_k_draft_iterations_and_one_verification_of_k_plus_one_tokens():
    hw, train, spec = load_machine("h100-sxm"), TrainConfig(workload="decode"), Speculation(draft=DRAFT, draft_tokens=3)
    step = speculative_step_s(TARGET, spec, train, Layout(), hw, decode_sequences=8, cached_tokens=8 * 1024)
    draft = iteration_s(DRAFT, train, Layout(), hw, decode_sequences=8, cached_tokens=8 * 1024)
    verify = iteration_s(TARGET, train, Layout(), hw, decode_sequences=8, cached_tokens=8 * 1024, tokens_per_sequence=4)
    plain = iteration_s(TARGET, train, Layout(), hw, decode_sequences=8, cached_tokens=8 * 1024)
    assert step == pytest.approx(3 * draft + verify)
    assert plain < verify < 4 * plain  # the weights are read once for the four tokens
