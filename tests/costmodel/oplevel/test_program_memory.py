"""Tests `costmodel/oplevel/program_memory.py`: arguments, peak temporaries and outputs over program order."""

import jax
import jax.numpy as jnp

from costmodel.oplevel.opgraph import TensorSpec
from costmodel.oplevel.program_memory import MemoryModel, temporary_bytes
from planner.intraop.extract import extract_graph

MIB = 2**20
X = jax.ShapeDtypeStruct((1024, 1024), jnp.float32)  # 4 MiB


def _model(fn, *args):
    return MemoryModel.of_graph(extract_graph(fn, *args))


def test_the_peak_counts_the_values_live_at_once_not_their_sum():
    # x·x and tanh(x·x)·x are each a 4 MiB buffer (tanh fuses into its reader); three matmuls
    # in a row hold at most two of them at once.
    chain = _model(lambda x: jnp.sum(jnp.tanh(jnp.tanh(x @ x) @ x) @ x), X)
    arguments, peak, outputs = chain.replicated().parts()
    assert arguments == 4 * MIB and outputs == 4  # the f32 scalar
    assert peak == 8 * MIB
    assert sum(v.tensor.nbytes for v in chain.temporaries) >= 12 * MIB


def test_a_value_nothing_reads_is_dead_code_not_a_buffer():
    def with_dead_value(x):
        jnp.broadcast_to(x[0, 0], (8192, 1024)) @ x  # 32 MiB broadcast and its product: traced, never read
        return jnp.sum(jnp.tanh(x @ x) @ x)

    dead = _model(with_dead_value, X).replicated()
    assert dead.peak_temporaries_bytes == _model(lambda x: jnp.sum(jnp.tanh(x @ x) @ x), X).replicated().peak_temporaries_bytes


def test_a_sharding_divides_each_value_by_its_pieces():
    model = _model(lambda x: jnp.sum(jnp.tanh(x @ x) @ x), X)
    split = model.breakdown(lambda n, k: (("d",), ()), {"d": 4})
    whole = model.replicated()
    assert split.arguments_bytes == whole.arguments_bytes / 4
    assert split.peak_temporaries_bytes == whole.peak_temporaries_bytes / 4


def test_an_output_reuses_a_donated_argument_of_its_shape():
    model = _model(lambda w: w @ w + 1.0, X)
    kept, donated = model.replicated(), model.breakdown(lambda n, k: (), {}, donated=model.input_nodes)
    assert kept.aliased_bytes == 0 and donated.aliased_bytes == 4 * MIB
    assert donated.total_bytes == kept.total_bytes - 4 * MIB


def test_the_cpu_backend_holds_16_bit_temporaries_as_float32():
    bf16 = TensorSpec(shape=(1024, 1024), dtype="bfloat16")
    assert temporary_bytes(bf16, "cpu") == 2 * temporary_bytes(bf16, "gpu") == 4 * MIB
    model = _model(lambda x: jnp.sum(jnp.tanh(x @ x) @ x), jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16))
    assert model.replicated("cpu").peak_temporaries_bytes == 2 * model.replicated("gpu").peak_temporaries_bytes


def test_live_at_names_the_values_between_their_producer_and_last_reader():
    model = _model(lambda x: jnp.sum(jnp.tanh(x @ x) @ x), X)
    for v in model.temporaries:
        assert v in model.live_at(v.start) and v in model.live_at(v.end)
        assert v not in model.live_at(v.end + 1)


def test_a_layer_loop_keeps_every_layer_s_saved_activations_as_compiled():
    # The forward scan stacks what the backward scan reads, one slice per layer: the carried
    # input and tanh's result, 8 MiB each per layer here. Counted once, this read 72 MiB
    # against XLA's 233 MiB of temporaries.
    def loss(ws, x):
        return jnp.sum(jax.lax.scan(lambda c, w: (c + jnp.tanh(c @ w), None), x, ws)[0] ** 2)

    args = jax.ShapeDtypeStruct((8, 512, 512), jnp.float32), jax.ShapeDtypeStruct((8, 512, 512), jnp.float32)
    predicted = _model(jax.grad(loss), *args).replicated("cpu").peak_temporaries_bytes
    compiled = jax.jit(jax.grad(loss)).lower(*args).compile().memory_analysis().temp_size_in_bytes
    assert predicted > 8 * 2 * 8 * MIB
    assert abs(predicted / compiled - 1) < 0.15
