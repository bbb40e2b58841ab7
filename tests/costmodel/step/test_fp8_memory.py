"""Tests `costmodel/step/fp8_memory.py`: the fp8 weight copies, what ZeRO gathers under the fp8 recipe, and fp8 frozen weights."""

import pytest

from costmodel.errors import InvalidConfigError, UnsupportedError
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import stack_with
from costmodel.inputs.train_config import Precision, TrainConfig
from costmodel.step.data_parallel import layer_params_per_device
from costmodel.step.fp8_memory import check_frozen_dtype, fp8_weight_copy_bytes, gathered_layer_param_bytes

M = ModelConfig(name="m", hidden_size=1024, num_layers=8, num_heads=16, ffn_size=4096, vocab_size=1000)
FP8 = TrainConfig(seq_len=512, global_batch=8).with_precision(Precision.FP8)
TE = stack_with("megatron-core")  # Transformer Engine: keeps its fp8 casts
FP8_PARAMS = stack_with("megatron-core", fp8_param_gather=True)


def _copies(train, layout):
    return fp8_weight_copy_bytes(M, train, layout, 0, layer_params=layer_params_per_device(M, layout))


def test_no_copies_outside_fp8_nor_where_the_program_recasts_on_use():
    assert _copies(TrainConfig(seq_len=512), Layout(tp=2, stack=TE)) == 0
    assert _copies(FP8, Layout(tp=2)) == 0  # the JAX program (stack "jax") keeps no fp8 weights


def test_cast_and_transpose_of_every_layer_stay_resident_without_zero3():
    layout = Layout(tp=2, pp=2, stack=TE)
    assert _copies(FP8, layout) == 2 * 4 * M.params_per_layer / 2  # 4 layers a stage, half of each on a tp rank


def test_zero3_holds_the_gathered_layers_copies_only():
    assert _copies(FP8, Layout(dp=4, zero_stage=3, stack=TE)) == 2 * 2 * M.params_per_layer


def test_fp8_parameters_replace_the_bf16_copy():
    assert _copies(FP8, Layout(dp=4, zero_stage=1, stack=FP8_PARAMS)) == 0  # fp8 weight + transpose = one bf16 copy
    assert _copies(FP8, Layout(dp=4, zero_stage=3, stack=FP8_PARAMS)) < 0  # the kept shard is fp8
    assert gathered_layer_param_bytes(FP8, Layout(stack=FP8_PARAMS)) == 1 and gathered_layer_param_bytes(FP8, Layout()) == 2


LORA_FP8 = TrainConfig(seq_len=512, global_batch=8, workload="finetune-lora", lora={"frozen_dtype": "fp8"}).with_precision(Precision.FP8)
LORA_BF16 = TrainConfig(seq_len=512, global_batch=8, workload="finetune-lora").with_precision(Precision.FP8)


def test_lora_keeps_the_transpose_of_fp8_frozen_weights_and_both_copies_of_bf16_ones():
    per_device = 8 * M.params_per_layer / 2
    assert _copies(LORA_FP8, Layout(tp=2, stack=TE)) == per_device  # the stored fp8 weight is its own cast
    assert _copies(LORA_BF16, Layout(tp=2, stack=TE)) == 2 * per_device
    assert _copies(LORA_FP8, Layout(tp=2)) == 0  # the JAX program keeps no transposes
    assert _copies(LORA_FP8, Layout(dp=4, zero_stage=3, stack=TE)) == 2 * M.params_per_layer  # the two layers gathered


def test_fp8_frozen_weights_need_the_fp8_recipe_and_int_ones_are_refused_under_it():
    check_frozen_dtype(LORA_FP8)
    with pytest.raises(InvalidConfigError, match="needs --precision fp8"):
        check_frozen_dtype(LORA_FP8.with_precision(Precision.BF16))
    with pytest.raises(UnsupportedError, match="int8 frozen weights under --precision fp8"):
        check_frozen_dtype(TrainConfig(workload="finetune-lora", lora={"frozen_dtype": "int8"}).with_precision(Precision.FP8))
    check_frozen_dtype(TrainConfig(workload="decode", inference={"weight_dtype": "fp8"}))  # serving fp8 weights: W8A8
    with pytest.raises(UnsupportedError, match="--precision fp8 is a training recipe"):
        check_frozen_dtype(TrainConfig(workload="decode").with_precision(Precision.FP8))
