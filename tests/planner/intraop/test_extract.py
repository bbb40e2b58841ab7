"""Tests `planner/intraop/extract.py`: jaxpr → OpGraph on arbitrary functions."""

import jax
import jax.numpy as jnp
import networkx as nx

from costmodel.oplevel.opgraph import OP_ATTR, ops, primitive_counts, total_flops
from planner.intraop.extract import extract_graph

F32 = jnp.float32


def _sds(*shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


def test_matmul_flops_and_bytes():
    g = extract_graph(lambda x, w: x @ w, _sds(4, 8), _sds(8, 16, dtype=jnp.bfloat16).update(dtype=F32))
    (dot,) = list(ops(g))
    assert dot.primitive == "dot_general" and dot.flops == 2 * 4 * 8 * 16
    assert (dot.bytes_read, dot.bytes_written) == ((4 * 8 + 8 * 16) * 4, 4 * 16 * 4)
    assert dot.dot.lhs_contracting == (1,) and dot.dot.rhs_contracting == (0,)


def test_scan_body_appears_once_with_its_trip_count():
    def stack(ws, x):
        def body(carry, w):
            return jnp.tanh(carry @ w), None
        return jax.lax.scan(body, x, ws)[0]

    small = extract_graph(stack, _sds(3, 8, 8), _sds(4, 8))
    deep = extract_graph(stack, _sds(30, 8, 8), _sds(4, 8))
    assert small.number_of_nodes() == deep.number_of_nodes()
    assert total_flops(deep) == 10 * total_flops(small) == 30 * (2 * 4 * 8 * 8 + 4 * 8)
    assert {op.repeat for op in ops(deep)} == {30}


def test_nested_scans_multiply_repeats():
    def inner(c, _):
        return c * 2.0, None

    def outer(c, _):
        return jax.lax.scan(inner, c, None, length=5)[0], None

    g = extract_graph(lambda x: jax.lax.scan(outer, x, None, length=3)[0], _sds(2))
    assert [op.repeat for op in ops(g) if op.primitive == "mul"] == [15]


def test_calls_are_inlined_and_edges_follow_data():
    @jax.jit
    def inner(x):
        return jnp.exp(x)

    def fn(x, y):
        z = jax.checkpoint(lambda a: jnp.sin(a) * 2.0)(inner(x))
        return jax.nn.relu(z + y)

    g = extract_graph(fn, _sds(4), _sds(4))
    prims = [op.primitive for op in ops(g)]
    assert "pjit" not in prims and "checkpoint" not in prims and "custom_jvp_call" not in prims
    assert {"exp", "sin", "mul", "add", "max"} <= set(prims)
    assert nx.is_directed_acyclic_graph(g)
    exp_node = next(n for n, d in g.nodes(data=True) if d[OP_ATTR].primitive == "exp")
    sin_node = next(n for n, d in g.nodes(data=True) if d[OP_ATTR].primitive == "sin")
    assert nx.has_path(g, exp_node, sin_node)


def test_inputs_are_labelled_by_pytree_path():
    params = {"w": _sds(8, 8), "b": _sds(8)}
    g = extract_graph(lambda p, x: x @ p["w"] + p["b"], params, _sds(2, 8))
    labels = sorted(d[OP_ATTR].label for _, d in g.nodes(data=True) if d[OP_ATTR].is_input)
    assert labels == ["[0]['b']", "[0]['w']", "[1]"]
    assert len(g.graph["outputs"]) == 1


def test_cond_costs_the_most_expensive_branch():
    def fn(p, x, w):
        return jax.lax.cond(p, lambda: x @ w, lambda: x)

    g = extract_graph(fn, _sds(dtype=jnp.bool_), _sds(4, 8), _sds(8, 8))
    assert primitive_counts(g)["dot_general"] == 1


def test_gradient_scopes_mark_the_backward_pass():
    def loss(w, x):
        with jax.named_scope("layer"):
            return jnp.sum(jnp.tanh(x @ w))

    g = extract_graph(jax.grad(loss), _sds(8, 8), _sds(4, 8))
    dots = [op for op in ops(g) if op.primitive == "dot_general"]
    assert len(dots) == 2  # forward, and the weight gradient (x's gradient is not asked for)
    assert [op.is_backward for op in dots] == [False, True]
    assert all("layer" in op.scope for op in dots)
    assert total_flops(g) >= 2 * (2 * 4 * 8 * 8)


def test_any_jittable_function_with_integer_and_scatter_ops():
    def fn(table, idx):
        rows = table[idx]
        return jnp.zeros_like(table).at[idx].add(rows).sum(axis=0)

    g = extract_graph(fn, _sds(10, 4), _sds(3, dtype=jnp.int32))
    assert total_flops(g) > 0 and g.number_of_nodes() > 3


def test_a_scans_stacked_results_are_listed_with_their_slices():
    def stack(ws, x):
        return jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), c * 2.0), x, ws)

    g = extract_graph(stack, _sds(6, 8, 8), _sds(4, 8))
    (node, k), = g.graph["stacked"]
    assert g.graph["stacked"][(node, k)] == 6 and g.nodes[node]["op"].primitive == "mul"
