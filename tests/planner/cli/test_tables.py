"""Tests `planner/cli/tables.py`: rows the plan and simulate summaries share."""

from costmodel.inputs.layout import Layout
from costmodel.inputs.stack import stack_with
from planner.cli.tables import xla_flags_row

SEQUENCE_PARALLEL = Layout(dp=4, tp=8, sequence_parallel=True)


def test_the_xla_flags_row_names_collective_matmul_where_the_prediction_assumes_it():
    name, value = xla_flags_row(SEQUENCE_PARALLEL, "h100-sxm")
    assert name == "XLA flags"
    assert value.startswith('XLA_FLAGS="--xla_gpu_threshold_for_windowed_einsum_mib=0 --xla_gpu_multi_streamed_windowed_einsum=true"')


def test_no_xla_flags_row_without_the_claim_or_off_a_gpu():
    assert xla_flags_row(Layout(dp=4, tp=8), "h100-sxm") is None  # all-reduces: nothing to decompose
    assert xla_flags_row(SEQUENCE_PARALLEL.model_copy(update={"stack": stack_with("megatron-core")}), "h100-sxm") is None
    assert xla_flags_row(SEQUENCE_PARALLEL, "tpu-v5p") is None  # not set up for TPUs (planner/programs/xla_options.py)
    assert xla_flags_row(SEQUENCE_PARALLEL, "no-such-part") is None
