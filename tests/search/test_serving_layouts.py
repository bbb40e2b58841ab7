"""Tests `search/serving_layouts.py`: serving layouts under memory and the per-token latency bound."""

import pytest

from costmodel.errors import InfeasibleError
from costmodel.hardware.machine import load_machine
from costmodel.inputs.layout import Layout
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.inference import simulate_inference
from planner.config import load_model
from search.serving_layouts import _splits_of, choose_serving_layout, compute_bound_tokens

H100 = load_machine("h100-sxm")


def _decode(batch, context, **inference):
    return TrainConfig(workload="decode", global_batch=batch, seq_len=context, inference=inference or None)


def test_a_batch_that_fills_the_compute_takes_the_most_tokens_per_s_and_the_runners_up_say_why_they_lost():
    # 448 sequences per replica reach the 295 tokens an H100 step needs to be compute-bound in bf16, and their
    # KV cache leaves dp8 within usable memory less the runtime reserve (512 would not: 79.2 GiB a device).
    choice = choose_serving_layout(load_model("llama3-8b"), _decode(448, 1024), H100, splits=None, n_devices=8)
    assert choice.best.layout.dp == 8 and choice.objective.startswith("throughput: the most output tokens/s")
    assert all(e.tokens_per_s <= choice.best.tokens_per_s for e, _ in choice.runners_up)
    assert all("fewer tokens/s" in why or "does not fit" in why for _, why in choice.runners_up)


@pytest.mark.parametrize("workload, batch, context", [("decode", 1, 4096), ("decode", 64, 4096), ("prefill", 1, 128)])
def test_a_small_batch_takes_the_least_latency_of_every_layout_costed(workload, batch, context):
    # The case (70B, batch 1 on 8 H100s: tp8 at 10 ms, not dp4 tp2 at 26.6 ms) and below the
    # compute-bound batch generally: the step reads weights, so splitting them cuts the latency.
    model, train = load_model("llama3-70b"), TrainConfig(workload=workload, global_batch=batch, seq_len=context)
    choice = choose_serving_layout(model, train, H100, splits=None, n_devices=8)
    latency = train.workload.of_step(decode="time_per_output_token_s", prefill="time_to_first_token_s")
    fitting = [simulate_inference(model, train, Layout(dp=dp, tp=tp, pp=pp), H100) for dp, tp, pp, _ in _splits_of(8)]
    assert getattr(choice.best, latency) == min(getattr(e, latency) for e in fitting if e.fits)
    assert choice.best.layout.tp == 8 and choice.objective.startswith("latency: the least")
    assert all("slower" in why or "does not fit" in why for _, why in choice.runners_up)
    assert compute_bound_tokens(train, H100) == pytest.approx(989.4e12 / 3.35e12)  # 2-byte weights, 2 FLOPs a weight


def test_a_latency_bound_ranks_by_tokens_per_s_within_it():
    # 64 sequences per replica at 4k context: tp8 has the least latency (5.8 ms); within 12 ms
    # dp4 tp2 (11.5 ms) serves more tokens/s, and under 7 ms only tp8 is quick enough (dp2 tp4: 7.4 ms).
    model = load_model("llama3-8b")
    free = choose_serving_layout(model, _decode(64, 4096), H100, splits=None, n_devices=8)
    within_12 = choose_serving_layout(model, _decode(64, 4096, max_token_latency_ms=12.0), H100, splits=None, n_devices=8)
    within_7 = choose_serving_layout(model, _decode(64, 4096, max_token_latency_ms=7.0), H100, splits=None, n_devices=8)
    assert free.best.layout.tp == 8 and not free.latency_bound
    assert (within_12.best.layout.dp, within_12.best.layout.tp) == (4, 2) and within_12.best.time_per_output_token_s <= 12e-3
    assert within_12.best.tokens_per_s > free.best.tokens_per_s and within_12.objective.startswith("latency-bound: dp8 tp1 pp1")
    assert within_7.latency_bound and within_7.best.layout.tp == 8 and within_7.best.time_per_output_token_s <= 7e-3


def test_an_unreachable_bound_names_the_best_latency():
    with pytest.raises(InfeasibleError, match=r"within 0.1 ms per output token: the best reachable is \d+\.\d+ ms"):
        choose_serving_layout(load_model("llama3-8b"), _decode(1, 2048, max_token_latency_ms=0.1), H100, splits=None, n_devices=8)


def test_a_model_too_large_for_the_devices_is_refused_with_its_least_memory():
    with pytest.raises(InfeasibleError, match="llama3-70b does not fit for decode on 1× h100-sxm.*fix: use more devices"):
        choose_serving_layout(load_model("llama3-70b"), _decode(1, 2048), H100, splits=None, n_devices=1)
    int4 = choose_serving_layout(load_model("llama3-70b"), _decode(1, 2048, weight_dtype="int4"), H100, splits=None, n_devices=1)
    assert int4.best.fits


def test_a_405b_model_on_32_tpu_chips_costs_1d_and_2d_splits_and_takes_the_cheaper():
    train = _decode(64, 2048)
    choice = choose_serving_layout(load_model("llama3-405b"), train, load_machine("tpu-v5p"), splits=None, n_devices=32)
    best, others = choice.best, [e for e, _ in choice.runners_up]
    assert best.layout.tp_embed > 1 and any(e.layout.tp_embed == 1 for e in others)  # the best 1D split is always shown
    assert all(e.time_per_output_token_s >= best.time_per_output_token_s for e in others)
    # Given a mesh, the search keeps to the 1D split its tensor axes carry.
    meshed = choose_serving_layout(load_model("llama3-405b"), train, load_machine("tpu-v5p"), splits=((1, 32, 1, 1),), n_devices=32)
    assert meshed.best.layout.tp_embed == 1
