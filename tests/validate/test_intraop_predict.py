"""Tests `validate/intraop_predict.py`: what an intra-op plan's pinned program does, from its choice."""

import pytest

from costmodel.inputs.model_config import ModelConfig
from costmodel.oplevel.opgraph import TensorSpec
from planner.api import plan
from validate.compile_check import compile_in_subprocess
from validate.intraop_predict import _reshard, predicted_argument_bytes, predicted_matmul_flops, predicted_memory_bytes
from validate.intraop_program import intra_op_program

TINY = ModelConfig(name="tiny", hidden_size=128, num_layers=2, num_heads=4, ffn_size=512, vocab_size=512)


@pytest.fixture(scope="module")
def compiled():
    p = plan(TINY, mesh="data=2,tensor=4", hardware="a100-80gb", seq_len=64, global_batch=16, planner="ilp")
    return intra_op_program(p), compile_in_subprocess(p)


def test_arguments_and_flops_are_what_the_compiled_program_has(compiled):
    program, report = compiled
    assert predicted_argument_bytes(program) == pytest.approx(report.argument_bytes, rel=1e-6)
    assert predicted_matmul_flops(program) == pytest.approx(report.matmul_flops, rel=0.02)


def test_memory_per_device_follows_the_compiled_peak(compiled):
    # 0.83 of the compiled peak at this size, where XLA's small fixed buffers weigh most;
    # gpt2-medium's ILP plan on 2x4 read 1.144 (the validator's tolerance is 15 %).
    program, report = compiled
    assert predicted_memory_bytes(program, platform="cpu") == pytest.approx(report.peak_bytes, rel=0.25)


def test_reshards_gather_dropped_axes_and_exchange_moved_ones():
    t = TensorSpec(shape=(8, 16), dtype="float32")  # 512 bytes
    sizes = {"data": 2, "tensor": 4}
    assert _reshard(t, (("data",), ()), ((), ()), sizes) == [("all-gather", ["data"], 512.0)]
    assert _reshard(t, (("data",), ()), ((), ("data",)), sizes) == [("all-to-all", ["data"], 256.0)]
    assert _reshard(t, ((), ()), (("data",), ()), sizes) == []
    assert _reshard(t, (("data", "tensor"), ()), (("tensor", "data"), ()), sizes) == [("collective-permute", ["tensor", "data"], 64.0)]
    assert _reshard(t, (("tensor",), ()), (("data", "tensor"), ()), sizes) == [("collective-permute", ["data", "tensor"], 64.0)]
    assert _reshard(t, (("tensor",), ()), (("tensor", "data"), ()), sizes) == []
