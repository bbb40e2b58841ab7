"""Tests `search/serve_capacity.py`: layouts and batch limits costed by continuous batching, capacity by bisection."""

import pytest

from costmodel.errors import InfeasibleError, InvalidPlanError
from costmodel.hardware.machine import load_machine
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.continuous_batching import LengthDistribution, ServeConfig, simulate_serving
from search.serve_capacity import Slo, capacity_per_s, saturated_per_s, serve_options, tp_degrees

MODEL = ModelConfig(name="m", hidden_size=2048, num_layers=16, num_heads=16, num_kv_heads=4, ffn_size=8192, vocab_size=32000)
HW, TRAIN = load_machine("h100-sxm"), TrainConfig(workload="decode")
CFG = ServeConfig(rate_per_s=5, input_len=LengthDistribution(fixed=256), output_len=LengthDistribution(fixed=64), requests=150)
SLO = Slo(ttft_s=0.2, tpot_s=0.012)


def test_the_capacity_is_the_rate_where_the_targets_stop_holding():
    tight = Slo(ttft_s=0.2, tpot_s=0.0025)  # between a trickle's 2.0 ms and the saturated 4.4 ms
    capacity = capacity_per_s(MODEL, TRAIN, Layout(), HW, CFG, tight, start_per_s=5)
    assert 0 < capacity < saturated_per_s(MODEL, TRAIN, Layout(), HW, CFG)
    assert tight.met_by(simulate_serving(MODEL, TRAIN, Layout(), HW, CFG.model_copy(update={"rate_per_s": capacity})))
    assert not tight.met_by(simulate_serving(MODEL, TRAIN, Layout(), HW, CFG.model_copy(update={"rate_per_s": capacity * 1.1})))


def test_without_targets_the_capacity_is_the_saturated_throughput():
    assert capacity_per_s(MODEL, TRAIN, Layout(), HW, CFG, Slo(), start_per_s=5) == saturated_per_s(MODEL, TRAIN, Layout(), HW, CFG)


def test_options_cover_each_degree_and_batch_limit_most_capacity_first():
    options = serve_options(MODEL, TRAIN, HW, n_devices=4, cfg=CFG, slo=SLO, batch_limits=(16, 256))
    assert {(o.layout.tp, o.layout.dp, o.max_batch) for o in options} == {(t, 4 // t, b) for t in (1, 2, 4) for b in (16, 256)}
    assert [o.capacity_per_s for o in options if o.meets_slo] == sorted((o.capacity_per_s for o in options if o.meets_slo), reverse=True)
    assert options[0].meets_slo


def test_a_pinned_degree_is_the_only_one_tried_and_degrees_follow_the_node_and_heads():
    assert {o.layout.tp for o in serve_options(MODEL, TRAIN, HW, n_devices=4, cfg=CFG, slo=SLO, batch_limits=(256,), tp=2)} == {2}
    assert tp_degrees(MODEL, 16, 8) == [1, 2, 4, 8]
    assert tp_degrees(MODEL.model_copy(update={"num_heads": 12}), 8, 8) == [1, 2, 4]


@pytest.mark.parametrize("tp", [3, 16])
def test_a_pinned_degree_the_devices_cannot_carry_is_refused_in_one_line(tp):
    with pytest.raises(InvalidPlanError, match=f"--tp {tp}: 8 devices .* can carry tp 1, 2, 4, 8 only"):
        serve_options(MODEL, TRAIN, HW, n_devices=8, cfg=CFG, slo=SLO, tp=tp)


def test_nothing_holding_a_request_is_refused_in_one_line():
    huge = CFG.model_copy(update={"input_len": LengthDistribution(fixed=50_000_000)})
    with pytest.raises(InfeasibleError, match="no layout of 2 devices"):
        serve_options(MODEL, TRAIN, HW, n_devices=2, cfg=huge, slo=SLO)


def test_the_saturated_rate_is_sustained_with_the_batch_full_not_a_short_bursts_average():
    sustained = saturated_per_s(MODEL, TRAIN, Layout(), HW, CFG)
    short = simulate_serving(MODEL, TRAIN, Layout(), HW, CFG.model_copy(update={"arrivals_s": (0.0,) * CFG.requests}))
    assert sustained > 1.2 * short.requests_per_s  # 150 requests never fill a batch of 256, and their run ends in its tail
    options = serve_options(MODEL, TRAIN, HW, n_devices=1, cfg=CFG.model_copy(update={"rate_per_s": 2 * sustained}), slo=Slo(),
                            batch_limits=(256,))
    assert not options[0].meets_slo and options[0].capacity_per_s == pytest.approx(sustained)  # past the capacity: not met
