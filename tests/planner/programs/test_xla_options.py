"""Tests `planner/programs/xla_options.py`: the XLA options the reference program compiles with."""

import subprocess
import sys

import pytest

from costmodel.inputs.layout import Layout
from costmodel.inputs.stack import stack_with
from planner.programs.xla_options import COLLECTIVE_MATMUL, compile_options, xla_flags


def test_collective_matmul_only_for_sequence_parallel_tensor_axes_of_the_jax_stack_on_a_gpu():
    assert compile_options(Layout(tp=8, sequence_parallel=True), "gpu") == COLLECTIVE_MATMUL["gpu"]
    assert compile_options(Layout(tp=8, sequence_parallel=False), "gpu") == {}
    assert compile_options(Layout(dp=8), "gpu") == {}
    assert compile_options(Layout(tp=8, sequence_parallel=True, stack=stack_with("megatron-core")), "gpu") == {}
    assert compile_options(Layout(tp=8, sequence_parallel=True), "cpu") == {}


@pytest.mark.jax
def test_this_jaxlib_knows_every_option():
    # XLA aborts at start-up on a flag it does not define, on any backend: a renamed option fails here, not on a GPU.
    env_flags = xla_flags(COLLECTIVE_MATMUL["gpu"])
    run = subprocess.run([sys.executable, "-c", "import jax; jax.numpy.ones(2).block_until_ready()"],
                         env={"XLA_FLAGS": env_flags, "JAX_PLATFORMS": "cpu", "PATH": ""}, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-500:]
    bogus = subprocess.run([sys.executable, "-c", "import jax; jax.numpy.ones(2)"],
                           env={"XLA_FLAGS": "--xla_gpu_no_such_option=1", "JAX_PLATFORMS": "cpu", "PATH": ""},
                           capture_output=True, text=True, timeout=120)
    assert bogus.returncode != 0
