"""Tests `costmodel/fp8.py`: the fp8 weight copies and what ZeRO gathers under the fp8 recipe."""

from costmodel.data_parallel import layer_params_per_device
from costmodel.fp8 import fp8_weight_copy_bytes, gathered_layer_param_bytes
from costmodel.layout import Layout
from costmodel.model_config import ModelConfig
from costmodel.stack import stack_with
from costmodel.train_config import Precision, TrainConfig

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
