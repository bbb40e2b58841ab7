"""Tests `search/serving_layouts.py`: serving layouts under memory and the per-token latency bound."""

import pytest

from costmodel.errors import InfeasibleError
from costmodel.hardware.machine import load_machine
from costmodel.inputs.train_config import TrainConfig
from planner.config import load_model
from search.serving_layouts import choose_serving_layout

H100 = load_machine("h100-sxm")


def _decode(batch, context, **inference):
    return TrainConfig(workload="decode", global_batch=batch, seq_len=context, inference=inference or None)


def test_the_choice_has_the_most_tokens_per_s_and_the_runners_up_say_why_they_lost():
    choice = choose_serving_layout(load_model("llama3-8b"), _decode(64, 4096), H100, splits=None, n_devices=8)
    assert all(e.tokens_per_s <= choice.best.tokens_per_s for e, _ in choice.runners_up)
    assert all("fewer tokens/s" in why or "does not fit" in why for _, why in choice.runners_up)


def test_a_latency_bound_trades_throughput_for_latency():
    # 64 sequences per replica at 4k context: eight replicas serve the most tokens/s at 18 ms
    # per token; under 5 ms only tensor parallelism over all eight is quick enough.
    model = load_model("llama3-8b")
    free = choose_serving_layout(model, _decode(64, 4096), H100, splits=None, n_devices=8)
    bounded = choose_serving_layout(model, _decode(64, 4096, max_token_latency_ms=5.0), H100, splits=None, n_devices=8)
    assert free.best.layout.dp == 8 and free.best.time_per_output_token_s > 5e-3
    assert bounded.latency_bound and bounded.best.layout.tp == 8 and bounded.best.time_per_output_token_s <= 5e-3
    assert bounded.best.tokens_per_s < free.best.tokens_per_s


def test_an_unreachable_bound_names_the_best_latency():
    with pytest.raises(InfeasibleError, match=r"within 0.1 ms per output token: the best reachable is \d+\.\d+ ms"):
        choose_serving_layout(load_model("llama3-8b"), _decode(1, 2048, max_token_latency_ms=0.1), H100, splits=None, n_devices=8)


def test_a_model_too_large_for_the_devices_is_refused_with_its_least_memory():
    with pytest.raises(InfeasibleError, match="llama3-70b does not fit for decode on 1× h100-sxm.*fix: use more devices"):
        choose_serving_layout(load_model("llama3-70b"), _decode(1, 2048), H100, splits=None, n_devices=1)
    int4 = choose_serving_layout(load_model("llama3-70b"), _decode(1, 2048, weight_dtype="int4"), H100, splits=None, n_devices=1)
    assert int4.best.fits
