"""Loop nests read from primitive parameters."""

import jax
import jax.numpy as jnp
import pytest

from costmodel.oplevel.opgraph import TensorSpec, ops
from planner.intraop.extract import extract_graph
from planner.intraop.loops import _reshape_map, loop_nest


def t(*shape):
    return TensorSpec(shape=shape, dtype="float32")


def test_dot_general_loops_are_batch_free_then_contracting():
    # bsd,dnh->bsnh: free b, s (lhs), n, h (rhs), contracting d.
    nest = loop_nest("dot_general", (t(2, 8, 16), t(16, 4, 32)), (t(2, 8, 4, 32),),
                     {"dimension_numbers": (((2,), (0,)), ((), ()))})
    assert nest.sizes == (2, 8, 4, 32, 16)
    assert nest.reduced == (False, False, False, False, True)
    assert nest.operands == ((0, 1, 4), (4, 2, 3))
    assert nest.results == ((0, 1, 2, 3),)


def test_batched_dot_shares_the_batch_loop():
    nest = loop_nest("dot_general", (t(4, 8, 16), t(4, 16, 32)), (t(4, 8, 32),),
                     {"dimension_numbers": (((2,), (1,)), ((0,), (0,)))})
    assert nest.operands == ((0, 1, 3), (0, 3, 2))


def test_elementwise_scalar_operand_is_not_indexed():
    nest = loop_nest("mul", (t(4, 8), t()), (t(4, 8),), {})
    assert nest.operands == ((0, 1), ())


def test_elementwise_operand_broadcast_along_size_one_dimensions_follows_the_rest():
    # x * rsqrt(var): var (B, S, 1) is split along batch and sequence as x is.
    nest = loop_nest("mul", (t(4, 8, 16), t(4, 8, 1)), (t(4, 8, 16),), {})
    assert nest.operands == ((0, 1, 2), (0, 1, None))


def test_broadcast_maps_kept_dimensions_and_leaves_size_one_ones():
    nest = loop_nest("broadcast_in_dim", (t(1, 8),), (t(4, 8),), {"broadcast_dimensions": (0, 1), "shape": (4, 8)})
    assert nest.operands == ((None, 1),)


def test_cumsum_axis_is_not_split():
    nest = loop_nest("cumsum", (t(4, 8),), (t(4, 8),), {"axis": 1, "reverse": False})
    assert nest.operands == ((0, None),)


@pytest.mark.parametrize("src, dst, expected", [
    ((2, 3, 4), (2, 12), (0, 1, None)),
    ((2, 12), (2, 3, 4), (0, 1)),
    ((8, 1, 4), (8, 4), (0, None, 1)),
    ((6, 4), (4, 6), (0, None)),  # blocks of either major dimension are the same contiguous runs
])
def test_reshape_keeps_the_major_dimension_of_each_group(src, dst, expected):
    assert _reshape_map(src, dst) == expected


def test_extraction_attaches_loop_nests_and_operand_positions():
    """exp(x) * x: one edge from the input to mul carries operand 1, one from exp operand 0."""
    x = jax.ShapeDtypeStruct((4, 8), jnp.float32)
    g = extract_graph(lambda x: jnp.sum(jnp.exp(x) * x, axis=1), x)
    by_primitive = {op.primitive: op for op in ops(g)}
    assert by_primitive["reduce_sum"].loops.reduced == (False, True)
    assert by_primitive["mul"].loops.operands == ((0, 1), (0, 1))
    mul_node = next(n for n, d in g.nodes(data=True) if d["op"].primitive == "mul")
    assert sorted(u for _, _, d in g.in_edges(mul_node, data=True) for u in d["uses"]) == [(0, 0), (0, 1)]
