"""Tests `planner/intraop/pinned.py`: a traced program re-bound with each equation's chosen shardings pinned."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp

from planner.intraop.extract import extract_graph
from planner.intraop.pinned import PinnedInterpreter

X = jax.ShapeDtypeStruct((16, 32), jnp.float32)
W = jax.ShapeDtypeStruct((4, 32, 32), jnp.float32)


def _layers(x, ws):
    y, _ = jax.lax.scan(lambda c, w: (jax.checkpoint(lambda c: jnp.tanh(c @ w))(c), None), x, ws)
    return jnp.sum(y)


def test_without_strategies_the_program_computes_what_it_traced():
    closed = jax.make_jaxpr(jax.grad(_layers))(X, W)
    nodes = extract_graph(jax.grad(_layers), X, W).graph["eqn_nodes"]
    x, ws = jnp.ones(X.shape) * 0.1, jnp.ones(W.shape) * 0.01
    (again,) = PinnedInterpreter(nodes, lambda node: None, mesh=None).call(closed.jaxpr, list(closed.consts), [x, ws])
    assert jnp.allclose(again, jax.grad(_layers)(x, ws))


def test_every_leaf_equation_inside_scans_and_remat_regions_has_its_node():
    g = extract_graph(jax.grad(_layers), X, W)
    nodes = g.graph["eqn_nodes"]
    seen = []
    PinnedInterpreter(nodes, lambda node: seen.append(node), mesh=None).call(
        *(lambda c: (c.jaxpr, list(c.consts)))(jax.make_jaxpr(jax.grad(_layers))(X, W)), [jnp.ones(X.shape), jnp.ones(W.shape)])
    assert set(seen) == set(nodes.values()) and len(nodes) > 8


def test_a_pinned_result_is_partitioned_as_chosen():
    # Left to XLA, x @ w with x split by rows keeps the rows split; pinned, the result is split by columns.
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp
        from jax.sharding import NamedSharding, PartitionSpec as P
        from costmodel.oplevel.strategies import Strategy
        from planner.intraop.extract import extract_graph
        from planner.intraop.pinned import PinnedInterpreter
        f = lambda x, w: x @ w
        x, w = jax.ShapeDtypeStruct((16, 32), jnp.float32), jax.ShapeDtypeStruct((32, 32), jnp.float32)
        (node,) = extract_graph(f, x, w).graph["eqn_nodes"].values()
        mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
        columns = Strategy(name="cols", operands=(((), ()), ((), ("d",))), results=(((), ("d",)),), compute_s=0, communication_s=0,
                           memory_bytes=0)
        closed = jax.make_jaxpr(f)(x, w)
        run = PinnedInterpreter({(0,): node}, lambda n: columns, mesh)
        out = jax.jit(lambda x, w: run.call(closed.jaxpr, [], [x, w])[0],
                      in_shardings=(NamedSharding(mesh, P("d")), NamedSharding(mesh, P()))).lower(x, w).compile()
        print(out.output_shardings.spec)
    """)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=True)
    assert out.stdout.strip() == "P(None, 'd')"
