"""The strategy space of a graph: followers, edge classes, dominance pruning."""

import itertools

import pytest

from costmodel.hardware.machine import load_machine
from costmodel.oplevel.opgraph import OP_ATTR, LoopNest, OpNode, TensorSpec, add_input, add_op, new_op_graph
from costmodel.oplevel.strategies import op_strategies, reshard_s
from costmodel.oplevel.strategy_space import build_space, prune_dominated
from costmodel.step.collectives import Group, Tier, exposed_s

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


def test_a_parameter_gather_hides_behind_the_matmul_reading_it():
    g, n = mlp_graph()
    space = build_space(g, GROUPS, MACHINE)
    x_rows = next(i for i, s in enumerate(space.strategies[n["x"]]) if s.results[0] == (("data",), ()))
    w1_rows = next(i for i, s in enumerate(space.strategies[n["w1"]]) if s.results[0] == (("tensor",), ()))
    dot = next(i for i, s in enumerate(space.strategies[n["h"]]) if s.operands == ((("data",), ()), ((), ())))
    choice = {v: 0 for v in space.free_nodes} | {n["x"]: x_rows, n["w1"]: w1_rows, n["h"]: dot}
    edge = next(e for e in space.edges if (e.src, e.dst) == (n["w1"], n["h"]))
    gather_s = reshard_s(t(256, 1024), (("tensor",), ()), ((), ()), GROUPS)
    window_s = min(s.compute_s for j, s in enumerate(space.strategies[n["h"]])
                   if edge.dst_class[j] == edge.dst_class[dot])
    assert edge.cost_s(choice[n["w1"]], dot) == pytest.approx(exposed_s(gather_s, window_s, MACHINE.efficiency.overlap_slowdown))
    assert 0 < edge.cost_s(choice[n["w1"]], dot) < gather_s


def test_a_weight_gradient_reduces_behind_compute_and_an_activation_gradient_does_not():
    g = new_op_graph("backward")
    x, dy, w = (add_input(g, t(512, 256), label=name) for name in ("x", "dy", "w"))
    nest = LoopNest(sizes=(256, 256, 512), reduced=(False, False, True), operands=((2, 0), (2, 1)), results=((0, 1),))
    dw = add_op(g, OpNode(primitive="dot_general", inputs=(t(512, 256), t(512, 256)), outputs=(t(256, 256),),
                          flops=2 * 512 * 256 * 256, loops=nest, scope="transpose(jvp())"), [(x, 0), (dy, 0)])
    update = add_op(g, OpNode(primitive="sub", inputs=(t(256, 256), t(256, 256)), outputs=(t(256, 256),), scope="optimizer",
                              loops=LoopNest(sizes=(256, 256), reduced=(False, False), operands=((0, 1), (0, 1)),
                                             results=((0, 1),))), [(w, 0), (dw, 0)])
    space = build_space(g, {"data": GROUPS["data"]}, MACHINE)
    reduced = [s for s in space.strategies[dw] if "all-reduce(data)" in s.name]
    on_path = [s for s in op_strategies(g.nodes[dw][OP_ATTR], {"data": GROUPS["data"]}, MACHINE) if "all-reduce(data)" in s.name]
    assert reduced and all(0 < s.communication_s < t.communication_s for s, t in zip(reduced, on_path))
    assert space.followers[update][0] == dw  # w - dw runs where the gradient is, not where the input w is


def test_a_fused_chain_costs_less_than_its_ops_one_by_one():
    g, n = mlp_graph()
    fused = build_space(g, GROUPS, MACHINE)
    replicated = {v: 0 for v in fused.free_nodes}
    elementwise = [n["hb"], n["a"]]
    one_by_one = sum(op_strategies(g.nodes[v][OP_ATTR], GROUPS, MACHINE)[0].compute_s for v in elementwise)
    assert sum(fused.chosen(v, replicated).compute_s for v in elementwise) < one_by_one


def test_names_change_no_cost_and_stay_in_the_labels():
    # Unrolled layers differ only in their scopes: build_space costs each once, so names must not matter.
    g, n = mlp_graph()
    renamed = g.copy()
    for node in renamed.nodes:
        renamed.nodes[node][OP_ATTR] = renamed.nodes[node][OP_ATTR].model_copy(update={"scope": "layer_7"})
    plain, named = build_space(g, GROUPS, MACHINE), build_space(renamed, GROUPS, MACHINE)
    assert plain.strategies == named.strategies and plain.followers == named.followers
    assert all((plain.node_time_s[k] == named.node_time_s[k]).all() for k in plain.strategies)
    assert named.labels[n["h"]] == "dot_general@layer_7"
