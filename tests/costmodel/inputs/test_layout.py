"""Tests `costmodel/inputs/layout.py`: layout consistency checks."""

import pytest

from costmodel.errors import InvalidPlanError
from costmodel.inputs.layout import Layout, check_layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig

MODEL = ModelConfig(name="m", hidden_size=64, num_layers=4, num_heads=8, num_kv_heads=2, ffn_size=256,
                    vocab_size=128, num_experts=4, experts_per_token=2)
TRAIN = TrainConfig(seq_len=128, global_batch=16)


def test_consistent_layout_passes():
    lay = Layout(dp=2, tp=2, pp=2, micro_batch=2, ep=2)
    check_layout(lay, MODEL, TRAIN, n_devices=8)
    assert lay.micro_batches(TRAIN) == 4


@pytest.mark.parametrize(
    ("layout", "n_devices", "message"),
    [
        (Layout(dp=2, tp=2), 8, "= 4 but devices=8"),
        (Layout(tp=3), 3, "num_heads=8 is not divisible by tp=3"),
        (Layout(pp=4, interleave=2), 4, "num_layers=4 < pp·interleave = 8"),
        (Layout(dp=3), 3, "global_batch=16 is not divisible"),
        (Layout(cp=3), 3, "seq_len=128 is not divisible by cp=3"),
        (Layout(dp=2, ep=8), 2, "ep=8"),
        (Layout(interleave=2), 1, "needs pipeline parallelism"),
    ],
)
def test_inconsistent_layouts_say_what_to_change(layout, n_devices, message):
    with pytest.raises(InvalidPlanError) as info:
        check_layout(layout, MODEL, TRAIN, n_devices=n_devices)
    assert message in str(info.value) and "fix:" in str(info.value)


@pytest.mark.parametrize("stage_layers, interleave", [((3, 3), 1), ((2, 2, 4), 1), ((4, 4), 2)])
def test_stage_layers_must_cover_the_layers_once_without_interleaving(stage_layers, interleave):
    m = ModelConfig(name="m", hidden_size=64, num_layers=8, num_heads=4, ffn_size=256, vocab_size=128)
    layout = Layout(pp=2, stage_layers=stage_layers, interleave=interleave, micro_batch=1)
    with pytest.raises(InvalidPlanError, match="stage_layers"):
        check_layout(layout, m, TrainConfig(global_batch=8), n_devices=2)


def test_uneven_stages_are_valid_and_counted():
    m = ModelConfig(name="m", hidden_size=64, num_layers=8, num_heads=4, ffn_size=256, vocab_size=128)
    layout = Layout(pp=2, stage_layers=(3, 5))
    check_layout(layout, m, TrainConfig(global_batch=8), n_devices=2)
    assert [layout.layers_on_stage(8, s) for s in range(2)] == [3, 5]


def test_the_step_in_backward_is_refused_with_gradient_accumulation_or_offload():
    in_bwd = TrainConfig(seq_len=128, global_batch=16, optimizer_in_backward=True)
    check_layout(Layout(dp=2, micro_batch=8), MODEL, in_bwd, n_devices=2)  # one micro-batch per step
    with pytest.raises(InvalidPlanError, match="cannot accumulate 2 micro-batches; fix: give --micro-batch"):
        check_layout(Layout(dp=2, micro_batch=4), MODEL, in_bwd, n_devices=2)
    with pytest.raises(InvalidPlanError, match="ZeRO-Offload's CPU Adam"):
        check_layout(Layout(dp=2, micro_batch=8, offload="optimizer"), MODEL, in_bwd, n_devices=2)
    with pytest.raises(InvalidPlanError, match="not 8bit state"):
        check_layout(Layout(dp=2, micro_batch=8, offload="optimizer"), MODEL,
                     TrainConfig(seq_len=128, global_batch=16, optimizer_state="8bit"), n_devices=2)


def test_offloading_the_parameters_needs_zero_3_without_pipeline_stages_nor_the_step_in_backward():
    train = TrainConfig(seq_len=128, global_batch=16)
    check_layout(Layout(dp=2, micro_batch=8, zero_stage=3, offload="params"), MODEL, train, n_devices=2)
    for layout in (Layout(dp=2, micro_batch=8, zero_stage=2, offload="params"),
                   Layout(dp=2, pp=2, micro_batch=8, zero_stage=3, offload="params")):
        with pytest.raises(InvalidPlanError, match="copies each ZeRO-3 shard up before its gather.*fix: use --zero 3"):
            check_layout(layout, MODEL, train, n_devices=layout.n_devices)
    with pytest.raises(InvalidPlanError, match="steps on the host after the backward"):
        check_layout(Layout(dp=2, micro_batch=8, zero_stage=3, offload="params"), MODEL,
                     train.model_copy(update={"optimizer_in_backward": True}), n_devices=2)


def test_offloading_activations_is_refused_with_pipeline_stages():
    train = TrainConfig(seq_len=128, global_batch=16)
    check_layout(Layout(dp=2, micro_batch=8, offload_activations=True), MODEL, train, n_devices=2)
    with pytest.raises(InvalidPlanError, match="without pipeline stages; this layout has 2; fix: drop --offload-activations"):
        check_layout(Layout(pp=2, micro_batch=8, offload_activations=True), MODEL, train, n_devices=2)
