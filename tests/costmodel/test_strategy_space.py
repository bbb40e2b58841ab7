"""The strategy space of a graph: followers, edge classes, dominance pruning."""

import itertools

import pytest

from costmodel.collectives import Group, Tier
from costmodel.machine import load_machine
from costmodel.opgraph import LoopNest, OpNode, TensorSpec, add_input, add_op, new_op_graph
from costmodel.strategy_space import build_space, prune_dominated

MACHINE = load_machine("a100-80gb")
TIER = Tier(bytes_per_s=1e11, latency_s=1e-6)
GROUPS = {"data": Group(n=2, n_nodes=1, intra=TIER, inter=TIER), "tensor": Group(n=2, n_nodes=1, intra=TIER, inter=TIER)}


def t(*shape):
    return TensorSpec(shape=shape, dtype="bfloat16")


def _dot(g, a, b, m, k, n):
    nest = LoopNest(sizes=(m, n, k), reduced=(False, False, True), operands=((0, 2), (2, 1)), results=((0, 1),))
    return add_op(g, OpNode(primitive="dot_general", inputs=(t(m, k), t(k, n)), outputs=(t(m, n),), flops=2 * m * k * n,
                            loops=nest), [(a, 0), (b, 0)])


def _elementwise(g, x, m, n, primitive="tanh"):
    nest = LoopNest(sizes=(m, n), reduced=(False, False), operands=((0, 1),), results=((0, 1),))
    return add_op(g, OpNode(primitive=primitive, inputs=(t(m, n),), outputs=(t(m, n),), flops=m * n, loops=nest), [(x, 0)])


def mlp_graph(m=512, d=256, f=1024):
    """x @ w1 → tanh → @ w2, with a broadcast bias added to the hidden layer."""
    g = new_op_graph("mlp")
    x, w1, w2, bias = (add_input(g, t(*s), label=n) for n, s in (("x", (m, d)), ("w1", (d, f)), ("w2", (f, d)), ("b", (f,))))
    h = _dot(g, x, w1, m, d, f)
    b = add_op(g, OpNode(primitive="broadcast_in_dim", inputs=(t(f),), outputs=(t(m, f),),
                         loops=LoopNest(sizes=(m, f), reduced=(False, False), operands=((1,),), results=((0, 1),))), [(bias, 0)])
    nest = LoopNest(sizes=(m, f), reduced=(False, False), operands=((0, 1), (0, 1)), results=((0, 1),))
    hb = add_op(g, OpNode(primitive="add", inputs=(t(m, f), t(m, f)), outputs=(t(m, f),), loops=nest), [(h, 0), (b, 0)])
    a = _elementwise(g, hb, m, f)
    y = _dot(g, a, w2, m, f, d)
    return g, {"x": x, "w1": w1, "w2": w2, "bias": bias, "h": h, "b": b, "hb": hb, "a": a, "y": y}


def test_elementwise_ops_follow_their_producer_and_broadcasts_their_reader():
    g, n = mlp_graph()
    space = build_space(g, GROUPS, MACHINE)
    assert space.followers[n["a"]][0] == n["h"]
    assert space.followers[n["hb"]][0] == n["h"]
    assert space.followers[n["b"]][0] == n["h"]  # via the add it feeds
    assert {n["x"], n["w1"], n["w2"], n["bias"], n["h"], n["y"]} == set(space.free_nodes)
    # A follower's sharding is its leader's, strategy by strategy.
    for i, leader in enumerate(space.strategies[n["h"]]):
        assert space.chosen(n["a"], {n["h"]: i}).results == leader.results


def test_edge_classes_reproduce_the_resharding_cost_of_every_choice():
    g, n = mlp_graph()
    space = build_space(g, GROUPS, MACHINE)
    for edge in space.edges:
        assert edge.matrix.shape == (edge.src_class.max() + 1, edge.dst_class.max() + 1)
        assert len(edge.src_class) == len(space.strategies[edge.src])
        assert len(edge.dst_class) == len(space.strategies[edge.dst])


def _brute_force(space):
    nodes = space.free_nodes
    best = min(itertools.product(*(range(len(space.strategies[v])) for v in nodes)),
               key=lambda c: space.total_time_s(dict(zip(nodes, c))))
    return space.total_time_s(dict(zip(nodes, best)))


def test_pruning_keeps_the_optimum_and_shrinks_the_space():
    g, _ = mlp_graph(m=64, d=32, f=64)
    one_axis = {"data": GROUPS["data"]}
    space = build_space(g, one_axis, MACHINE)
    pruned = prune_dominated(space)
    assert sum(map(len, pruned.strategies.values())) < sum(map(len, space.strategies.values()))
    assert _brute_force(pruned) == pytest.approx(_brute_force(space))


def test_memory_counts_inputs_by_factor():
    g, n = mlp_graph()
    space = build_space(g, GROUPS, MACHINE, memory_factor=lambda op: 4.0 if op.label.startswith("w") else 1.0)
    replicated = {v: 0 for v in space.free_nodes}
    assert space.memory_bytes(replicated) == pytest.approx(4.0 * 2 * (256 * 1024 * 2) + 512 * 256 * 2 + 1024 * 2)
