"""MFU's convention (`costmodel.workloads.flops`) by hand arithmetic, and every workload's FLOPs built from it."""

from __future__ import annotations

import pytest

from costmodel.hardware.machine import load_machine
from costmodel.inputs.layout import Layout
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.simulator import simulate
from costmodel.workloads.flops import matmul_params, training_flops_per_token
from planner.config import load_model

LLAMA3_8B = load_model("llama3-8b")


def test_llama3_8b_model_flops_by_hand():
    d, layers, heads, head_dim, kv, ffn, vocab = 4096, 32, 32, 128, 8, 14336, 128256
    attention = d * (heads * head_dim + 2 * kv * head_dim) + heads * head_dim * d  # wq, wk, wv, wo: 41.9 M
    mlp = 3 * d * ffn  # gate, up, down: 176.2 M
    layer = attention + mlp + 2 * d  # two RMSNorm scales
    n = layers * layer + d * vocab  # the head; the input embedding's lookup does no multiply-adds
    assert matmul_params(LLAMA3_8B) == n == 7_504_920_576
    assert n < LLAMA3_8B.total_params  # 8.03 B with the input embedding and final norm
    causal_attention = 6 * layers * heads * head_dim * 8192  # half PaLM's 12·L·H·Q·T
    assert training_flops_per_token(LLAMA3_8B, 8192) == 6 * n + causal_attention
    assert training_flops_per_token(LLAMA3_8B, 8192) == pytest.approx(51.47e9, rel=1e-3)


def test_mfu_is_model_flops_over_devices_times_peak():
    hw, train = load_machine("h100-sxm"), TrainConfig(seq_len=8192, global_batch=8)
    est = simulate(LLAMA3_8B, train, Layout(dp=8, micro_batch=1, recompute="full", zero_stage=3), hw)
    flops = 8 * 8192 * (6 * 7_504_920_576 + 6 * 32 * 32 * 128 * 8192)
    assert est.model_flops == pytest.approx(flops)
    assert est.mfu == pytest.approx(flops / (est.step_time_s * 8 * 989.4e12))
    assert est.hfu > est.mfu  # full recompute repeats the forward


def test_workloads_build_their_flops_from_the_same_terms():
    n, attention_fwd = 7_504_920_576, 2 * 32 * 32 * 128 * 2048  # causal forward a token at 2048
    lora = TrainConfig(seq_len=2048, workload="finetune-lora")
    adapters = lora.workload.trainable_params(LLAMA3_8B)
    assert lora.workload.model_flops(LLAMA3_8B, tokens=1, seq_len=2048) == pytest.approx(4 * n + 3 * attention_fwd + 6 * adapters)
    prefill = TrainConfig(seq_len=2048, workload="prefill").workload
    assert prefill.model_flops(LLAMA3_8B, tokens=1, seq_len=2048) == pytest.approx(2 * n + attention_fwd)
    decode = TrainConfig(seq_len=2048, workload="decode").workload  # a new token attends its whole cache
    assert decode.model_flops(LLAMA3_8B, tokens=1, seq_len=2048) == pytest.approx(2 * n + 2 * attention_fwd)
