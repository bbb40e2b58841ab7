"""Tests `validate/shard_check.py`: a user's function compiled as a shard result runs it, read back per device."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

# Data parallelism over 8 devices of a least-squares gradient: every device has 64/8 rows of x
# and the whole w; the gradient of w is summed over the data axis.
_CHILD = textwrap.dedent("""
    import json
    from types import SimpleNamespace

    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    from validate.shard_check import check_shard

    def step(w_DxF, x_BxD):
        return jax.grad(lambda w: jnp.sum((x_BxD @ w) ** 2))(w_DxF)

    w, x = jax.ShapeDtypeStruct((256, 512), jnp.float32), jax.ShapeDtypeStruct((64, 256), jnp.float32)
    def jit(fn, *args, mesh, donate_argnums):  # ShardResult.jit with data-parallel specs
        return jax.jit(fn, in_shardings=(NamedSharding(mesh, P()), NamedSharding(mesh, P("data", None))),
                       out_shardings=NamedSharding(mesh, P()), donate_argnums=donate_argnums)

    result = SimpleNamespace(jit=jit, mesh_axes=(("data", 8),), predicted_memory_bytes=2e6)
    print(json.dumps(check_shard(result, step, w, x, mesh=jax.make_mesh((8,), ("data",))).model_dump()))
""")


@pytest.fixture(scope="module")
def checked():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    run = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_memory_is_read_per_device_from_the_compiled_program(checked):
    w_bytes, x_shard_bytes = 256 * 512 * 4, 64 // 8 * 256 * 4
    assert checked["compiled_arguments_bytes"] == w_bytes + x_shard_bytes
    assert checked["compiled_outputs_bytes"] == w_bytes
    assert checked["compiled_bytes"] >= checked["compiled_arguments_bytes"] + checked["compiled_temporaries_bytes"]
    assert checked["predicted_bytes"] == 2e6


def test_flops_and_collectives_are_those_of_one_devices_share(checked):
    # Forward x·w and the weight gradient xᵀ·dy, each 2·(64/8)·256·512; no input gradient is asked for.
    assert checked["compiled_matmul_flops"] == 2 * (2 * 8 * 256 * 512)
    assert checked["collectives"] == {"all-reduce(data)": 1}
