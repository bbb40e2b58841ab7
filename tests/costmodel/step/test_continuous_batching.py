"""Tests `costmodel/step/continuous_batching.py`: requests served iteration by iteration, paged KV blocks, preemption, determinism."""

import pytest

from costmodel.errors import InfeasibleError
from costmodel.hardware.machine import load_machine
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.continuous_batching import (
    LengthDistribution,
    ServeConfig,
    kv_block_bytes,
    kv_block_capacity,
    simulate_serving,
)
from costmodel.step.inference import iteration_s
from costmodel.step.speculative import Speculation

MODEL = ModelConfig(name="m", hidden_size=2048, num_layers=16, num_heads=16, num_kv_heads=4, ffn_size=8192, vocab_size=32000)
DRAFT = ModelConfig(name="d", hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=4, ffn_size=2048, vocab_size=32000)
HW = load_machine("h100-sxm")
TRAIN = TrainConfig(workload="decode")


def _cfg(rate, prompt=256, output=64, **kw):
    return ServeConfig(rate_per_s=rate, input_len=LengthDistribution(fixed=prompt), output_len=LengthDistribution(fixed=output),
                       requests=kw.pop("requests", 200), **kw)


def test_the_same_seed_gives_the_same_numbers_and_another_seed_others():
    cfg = ServeConfig(
        rate_per_s=20, input_len=LengthDistribution(low=100, high=400), output_len=LengthDistribution(low=16, high=128), requests=200)
    assert simulate_serving(MODEL, TRAIN, Layout(), HW, cfg) == simulate_serving(MODEL, TRAIN, Layout(), HW, cfg)
    reseeded = cfg.model_copy(update={"seed": 1})
    assert simulate_serving(MODEL, TRAIN, Layout(), HW, reseeded) != simulate_serving(MODEL, TRAIN, Layout(), HW, cfg)


def test_a_lone_request_waits_one_prefill_and_then_one_decode_step_a_token():
    result = simulate_serving(MODEL, TRAIN, Layout(), HW, _cfg(0.01, requests=5))
    prefill_s = iteration_s(MODEL, TRAIN, Layout(), HW, decode_sequences=0, prompt_tokens=256)
    assert result.ttft_p50_s == pytest.approx(prefill_s)
    first_step = iteration_s(MODEL, TRAIN, Layout(), HW, decode_sequences=1, cached_tokens=256)
    last_step = iteration_s(MODEL, TRAIN, Layout(), HW, decode_sequences=1, cached_tokens=318)
    assert first_step <= result.tpot_p50_s <= last_step * 1.05
    assert result.mean_batch < 1 and result.preemptions == 0 and not result.queue_growing


def test_batches_grow_with_the_rate_as_little_s_law_says():
    result = simulate_serving(MODEL, TRAIN, Layout(), HW, _cfg(50, requests=400))
    decode_s = result.latency_p50_s - result.ttft_p50_s
    assert result.mean_batch == pytest.approx(50 * decode_s, rel=0.25)
    assert result.requests_per_s == pytest.approx(50, rel=0.15)


def test_replicas_share_the_arrivals_and_add_their_throughput():
    one = simulate_serving(MODEL, TRAIN, Layout(), HW, _cfg(40, requests=800))
    two = simulate_serving(MODEL, TRAIN, Layout(dp=2), HW, _cfg(40, requests=800))
    assert two.completed == 400 and two.mean_batch < one.mean_batch
    assert two.requests_per_s == pytest.approx(40, rel=0.1) and one.requests_per_s == pytest.approx(40, rel=0.1)


def test_throughput_is_the_steady_rate_not_diluted_by_warm_up_and_drain():
    # Each request takes a tenth of the time the arrivals last: the whole run's average would read a tenth less.
    slow = simulate_serving(MODEL, TRAIN, Layout(), HW, _cfg(10, output=2048, requests=500))
    assert slow.latency_p50_s > 0.1 * slow.duration_s and not slow.queue_growing
    assert slow.requests_per_s == pytest.approx(10, rel=0.1)
    assert slow.completed / slow.duration_s < 0.9 * slow.requests_per_s


def test_too_few_blocks_preempt_the_latest_and_every_request_still_completes():
    need = 3 * 256 // 16 + 2  # three prompts admitted, then too few blocks for their contexts to grow
    small = HW.model_copy(update={"hbm_bytes": HW.memory_reserve_bytes + _held(MODEL) + need * kv_block_bytes(MODEL, TRAIN, Layout())})
    assert kv_block_capacity(MODEL, TRAIN, Layout(), small) == need
    result = simulate_serving(MODEL, TRAIN, Layout(), small, _cfg(200, requests=50))
    assert result.completed == 50 and result.preemptions > 0 and result.kv_blocks_max_in_use <= need


def test_tensorrt_llm_reserves_each_request_whole_and_never_preempts():
    """GUARANTEED_NO_EVICT: where vLLM's scheduler admits three prompts and preempts as their contexts grow (the test
    above), TensorRT-LLM's admits only what it can finish, in 0.9 of the memory free beside the weights."""
    trt = TrainConfig(workload="decode", inference={"serving_stack": "tensorrt-llm"})
    need = 3 * 256 // 16 + 2
    small = HW.model_copy(update={"hbm_bytes": HW.memory_reserve_bytes + _held(MODEL) + need * kv_block_bytes(MODEL, TRAIN, Layout())})
    assert kv_block_capacity(MODEL, trt, Layout(), small) == int(0.9 * need)
    result = simulate_serving(MODEL, trt, Layout(), small, _cfg(200, requests=50))
    assert result.completed == 50 and result.preemptions == 0
    assert result.kv_blocks_max_in_use == 2 * 20 and result.mean_batch <= 2  # two whole requests (20 blocks each) at a time
    per_block = kv_block_bytes(MODEL, TRAIN, Layout()) + kv_block_bytes(DRAFT, TRAIN, Layout())
    # 0.9 of 45 blocks: two whole requests fill them, so a block past a request's end would preempt.
    small_spec = HW.model_copy(update={"hbm_bytes": HW.memory_reserve_bytes + _held(MODEL) + _held(DRAFT) + 45 * per_block})
    spec = _cfg(200, requests=50, speculation=Speculation(draft=DRAFT, acceptance_rate=0.9))
    assert simulate_serving(MODEL, trt, Layout(), small_spec, spec).preemptions == 0  # a step past a request's end takes no block


def _held(model):
    from costmodel.step.continuous_batching import _held_beside_cache
    return _held_beside_cache(model, TRAIN, Layout())


def test_a_rate_beyond_the_replica_grows_the_queue():
    assert simulate_serving(MODEL, TRAIN, Layout(), HW, _cfg(2000, prompt=2048, requests=300, max_batch=16)).queue_growing


def test_whole_prompt_iterations_pause_decoding():
    chunked = simulate_serving(MODEL, TRAIN, Layout(), HW, _cfg(60))
    whole = simulate_serving(MODEL, TRAIN, Layout(), HW, _cfg(60, prefill_chunk_tokens=None))
    assert whole.completed == chunked.completed and whole.tpot_p99_s > chunked.tpot_p99_s


def test_a_trace_s_arrivals_are_used_as_given():
    trace = tuple(float(t) for t in range(10))
    result = simulate_serving(MODEL, TRAIN, Layout(), HW, _cfg(1, requests=10, arrivals_s=trace))
    assert result.completed == 10 and result.duration_s == pytest.approx(9 + result.latency_p50_s, rel=0.05)


def test_speculation_trades_draft_steps_for_accepted_tokens():
    plain = simulate_serving(MODEL, TRAIN, Layout(), HW, _cfg(5))
    good = simulate_serving(MODEL, TRAIN, Layout(), HW, _cfg(5, speculation=Speculation(draft=DRAFT, acceptance_rate=0.9)))
    useless = simulate_serving(MODEL, TRAIN, Layout(), HW, _cfg(5, speculation=Speculation(draft=DRAFT, acceptance_rate=0.0)))
    assert good.tpot_p50_s < plain.tpot_p50_s < useless.tpot_p50_s
    assert good.kv_blocks < plain.kv_blocks  # the draft's weights and cache take their share


def test_a_request_no_device_can_hold_is_refused_in_one_line():
    with pytest.raises(InfeasibleError, match="the longest request needs"):
        simulate_serving(MODEL, TRAIN, Layout(), HW, _cfg(1, prompt=10_000_000))


def test_a_closed_loop_keeps_its_clients_busy_and_serves_more_of_them_slower():

    model = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=4, ffn_size=4096, vocab_size=1000)
    hw, train = load_machine("h100-sxm"), TrainConfig(workload="decode")

    def closed(clients: int):
        cfg = ServeConfig(concurrency=clients, input_len=LengthDistribution(fixed=256), output_len=LengthDistribution(fixed=64),
                          requests=64)
        return simulate_serving(model, train, Layout(), hw, cfg)

    one, many = closed(1), closed(16)
    assert one.completed == many.completed == 64
    assert one.mean_batch == pytest.approx(1.0, abs=0.05) and 8 < many.mean_batch <= 16
    assert many.requests_per_s > 5 * one.requests_per_s and many.tpot_p50_s > one.tpot_p50_s
    with pytest.raises(ValueError, match="give the load"):
        ServeConfig(input_len=LengthDistribution(fixed=8), output_len=LengthDistribution(fixed=8))
