"""Tests `validate/predict_decode.py` (and the decode branch of `validate/lowering.py`) against XLA."""

import pytest

from costmodel.errors import UnsupportedError

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
    (Layout(dp=2, tp=4), InferenceConfig(weight_dtype="fp8", kv_cache_dtype="fp8")),
], ids=["dp-tp", "tp-over-kv-heads", "dp-tp-int8", "dp-tp-fp8-weights-and-cache"])
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


def test_fp8_weights_and_cache_take_one_byte_each_in_the_arguments():
    bf16 = layout_plan(LLAMA, Layout(), hardware="h100-sxm", seq_len=100, global_batch=2, workload="decode")
    fp8 = layout_plan(LLAMA, Layout(), hardware="h100-sxm", seq_len=100, global_batch=2, workload="decode",
                      inference=InferenceConfig(weight_dtype="fp8", kv_cache_dtype="fp8"))
    layer_matrices = 4 * (256 * (256 + 2 * 128) + 256 * 256 + 3 * 256 * 512)  # layers · (qkv + out + gated MLP)
    cache = 2 * 4 * 2 * 112 * 4 * 32  # K and V · layers · batch · 7 blocks of 16 · kv heads · head_dim
    assert decode_argument_bytes(bf16) - decode_argument_bytes(fp8) == layer_matrices + cache  # one byte less each


def test_mixture_of_experts_decode_is_refused_in_one_line():
    moe = LLAMA.model_copy(update={"name": "tiny-moe", "num_experts": 4, "experts_per_token": 2, "moe_ffn_size": 512})
    plan = layout_plan(moe, Layout(tp=2), seq_len=64, global_batch=2, workload="decode")
    with pytest.raises(UnsupportedError, match="mixture-of-experts model, is not lowered yet"):
        compile_in_subprocess(plan)
