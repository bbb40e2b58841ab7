"""Tests `validate/predict_decode.py` (and the decode branch of `validate/lowering.py`) against XLA."""

import pytest

from costmodel.layout import Layout
from costmodel.model_config import ModelConfig
from costmodel.workload import InferenceConfig
from planner.api import layout_plan
from validate.compile_check import compile_in_subprocess
from validate.predict_decode import decode_argument_bytes, decode_unpredicted_features
from validate.report import checks

LLAMA = ModelConfig(name="tiny-llama", hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4, ffn_size=512, vocab_size=1024)


@pytest.mark.parametrize("layout, inference", [
    (Layout(dp=2, tp=4), InferenceConfig()),
    (Layout(tp=8), InferenceConfig(kv_block_size=64)),  # tp > kv heads: the cache is replicated over pairs
    (Layout(dp=4, tp=2), InferenceConfig(weight_dtype="int8")),
], ids=["dp-tp", "tp-over-kv-heads", "dp-tp-int8"])
def test_decode_arguments_flops_and_collectives_match_the_compiled_module(layout, inference):
    plan = layout_plan(LLAMA, layout, hardware="h100-sxm", seq_len=100, global_batch=8, workload="decode", inference=inference)
    assert decode_unpredicted_features(plan) == []
    results = {(c.item, c.axis): c for c in checks(plan, compile_in_subprocess(plan))}
    assert all(c.ok for c in results.values()), {k: (c.predicted, c.actual) for k, c in results.items() if not c.ok}
    assert ("all-reduce bytes", "tensor") in results and ("memory arguments", None) in results


def test_cache_is_rounded_up_to_whole_blocks_in_the_arguments():
    small = layout_plan(LLAMA, Layout(), seq_len=100, global_batch=2, workload="decode", inference=InferenceConfig(kv_block_size=16))
    large = layout_plan(LLAMA, Layout(), seq_len=100, global_batch=2, workload="decode", inference=InferenceConfig(kv_block_size=128))
    per_token = 2 * 4 * 2 * 4 * 32 * 2  # K and V · layers · batch · kv heads · head_dim · bf16
    assert decode_argument_bytes(large) - decode_argument_bytes(small) == per_token * (128 - 112)


def test_pipelined_decode_is_reported_not_predicted():
    plan = layout_plan(LLAMA, Layout(pp=2), seq_len=64, global_batch=2, workload="decode")
    assert decode_unpredicted_features(plan) == ["pipeline stages"]
