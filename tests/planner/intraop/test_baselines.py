"""Tests `planner/intraop/baselines.py`: the hand-written layouts `planner.intraop.shard` scores its choice against."""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from planner.intraop.baselines import BASELINES, baseline_specs

AXES = [("data", 4), ("model", 2)]


def _abstract(*shapes, dtype=jnp.float32):
    return tuple(jax.ShapeDtypeStruct(s, dtype) for s in shapes)


def test_data_parallelism_replicates_parameters_and_splits_the_batch_over_every_axis():
    w, tokens = _abstract((512, 256), (16, 128))
    specs = baseline_specs(({"w": w}, tokens), AXES, batch_argnums=(1,))
    assert specs["dp"] == ({"w": P()}, P(("data", "model"), None))


def test_fsdp_splits_each_leaf_on_its_largest_dimension_that_the_mesh_divides():
    params = {"wide": jax.ShapeDtypeStruct((24, 1024), jnp.float32), "odd": jax.ShapeDtypeStruct((7, 5), jnp.float32),
              "bias": jax.ShapeDtypeStruct((256,), jnp.float32)}
    (fsdp, _) = baseline_specs((params, _abstract((8, 16))[0]), AXES, batch_argnums=(1,))["fsdp"]
    assert fsdp == {"wide": P(None, ("data", "model")), "odd": P(None, None), "bias": P(("data", "model"))}


def test_fsdp_times_tensor_parallelism_keeps_the_last_axis_for_a_second_dimension():
    w, x = _abstract((512, 256), (16, 512))
    w_spec, x_spec = baseline_specs((w, x), AXES, batch_argnums=(1,))["fsdp_tp"]
    assert w_spec == P("data", "model") and x_spec == P("data", None)


def test_a_batch_the_axes_do_not_divide_keeps_the_prefix_that_does():
    w, x = _abstract((64, 64), (6, 64))
    assert baseline_specs((w, x), [("data", 2), ("model", 2)], batch_argnums=(1,))["dp"][1] == P("data", None)


def test_fsdp_times_tensor_parallelism_needs_two_axes_and_a_matrix():
    w, x = _abstract((512, 256), (16, 512))
    assert set(baseline_specs((w, x), [("data", 8)], batch_argnums=(1,))) == {"dp", "fsdp"}
    vectors = {"scale": jax.ShapeDtypeStruct((512,), jnp.float32)}
    assert set(baseline_specs((vectors, x), AXES, batch_argnums=(1,))) == {"dp", "fsdp"}
    assert set(baseline_specs((w, x), AXES, batch_argnums=(1,))) == set(BASELINES)
