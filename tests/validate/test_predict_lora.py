"""Tests `validate/predict_lora.py` (and the LoRA branch of `validate/lowering.py`) against XLA."""

import pytest

from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.workload import LoraConfig
from planner.api import layout_plan
from validate.compile_check import compile_in_subprocess
from validate.predict_lora import lora_unpredicted_features
from validate.report import checks

LLAMA = ModelConfig(name="tiny-llama", hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4, ffn_size=512, vocab_size=1024)


@pytest.mark.parametrize("layout, lora", [
    (Layout(dp=2, tp=4, micro_batch=1), LoraConfig()),
    (Layout(dp=4, tp=2, micro_batch=2, zero_stage=1, recompute="full"), LoraConfig(targets=("attn", "mlp"), frozen_dtype="int8")),
    (Layout(dp=8, micro_batch=1), LoraConfig(frozen_dtype="int4")),
    (Layout(dp=2, tp=4, micro_batch=1), LoraConfig(rank=8, targets="q,v")),
    (Layout(dp=4, tp=2, micro_batch=1, zero_stage=1), LoraConfig(targets="o,up,down")),
], ids=["dp-tp", "zero1-full-recompute-mlp-int8", "dp-int4", "dp-tp-query-value", "zero1-out-up-down"])
def test_lora_arguments_flops_and_collectives_match_the_compiled_module(layout, lora):
    plan = layout_plan(LLAMA, layout, hardware="a100-80gb", seq_len=128, global_batch=8, workload="finetune-lora", lora=lora)
    assert lora_unpredicted_features(plan) == []
    results = {(c.item, c.axis): c for c in checks(plan, compile_in_subprocess(plan))}
    exact = {k: c for k, c in results.items() if k[0] != "memory per device"}
    assert all(c.ok for c in exact.values()), {k: (c.predicted, c.actual) for k, c in exact.items() if not c.ok}
    assert ("all-reduce bytes", "data") in results and (layout.tp == 1 or ("all-reduce bytes", "tensor") in results)
    assert results[("memory arguments", None)].ok


def test_zero3_and_sequence_parallel_lora_are_reported_not_predicted():
    plan = layout_plan(LLAMA, Layout(dp=2, tp=4, zero_stage=3, sequence_parallel=True), hardware="a100-80gb", seq_len=128,
                       global_batch=8, workload="finetune-lora")
    assert lora_unpredicted_features(plan) == ["LoRA with ZeRO 3", "LoRA with sequence parallelism"]
