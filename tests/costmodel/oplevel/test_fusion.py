"""Fusions of an OpGraph's elementwise ops: what reaches HBM, what launches."""

from costmodel.oplevel.fusion import HbmTraffic, fused_traffic, recomputed
from costmodel.oplevel.opgraph import OP_ATTR, LoopNest, OpNode, TensorSpec, add_input, add_op, new_op_graph


def t(*shape, dtype="bfloat16"):
    return TensorSpec(shape=shape, dtype=dtype)


def unary(g, x, primitive="tanh", shape=(64, 64), *, dtype="bfloat16", out_dtype=None, scope="", repeat=1):
    return add_op(g, OpNode(primitive=primitive, inputs=(t(*shape, dtype=dtype),), outputs=(t(*shape, dtype=out_dtype or dtype),),
                            scope=scope, repeat=repeat), [(x, 0)])


def dot(g, a, b):
    nest = LoopNest(sizes=(64, 64, 64), reduced=(False, False, True), operands=((0, 2), (2, 1)), results=((0, 1),))
    return add_op(g, OpNode(primitive="dot_general", inputs=(t(64, 64), t(64, 64)), outputs=(t(64, 64),), flops=2 * 64**3,
                            loops=nest), [(a, 0), (b, 0)])


def test_a_chain_reads_its_input_once_writes_its_output_once_and_launches_once():
    g = new_op_graph("chain")
    x = add_input(g, t(64, 64), label="x")
    a = unary(g, x, "exp")
    b = unary(g, a, "tanh")
    c = add_op(g, OpNode(primitive="mul", inputs=(t(64, 64), t(64, 64)), outputs=(t(64, 64),)), [(b, 0), (x, 0)])
    traffic = fused_traffic(g)
    assert sum(sum(traffic[n].reads) for n in (a, b, c)) == 1  # x, once, though two ops read it
    assert [traffic[n].writes for n in (a, b, c)] == [(False,), (False,), (True,)]
    assert sum(traffic[n].launches for n in (a, b, c)) == 1


def test_a_matmul_between_two_elementwise_ops_splits_them_and_both_sides_touch_hbm():
    g = new_op_graph("sandwich")
    x, w = add_input(g, t(64, 64), label="x"), add_input(g, t(64, 64), label="w")
    a = unary(g, x)
    y = dot(g, a, w)
    b = add_op(g, OpNode(primitive="add", inputs=(t(64, 64), t(64, 64)), outputs=(t(64, 64),)), [(y, 0), (a, 0)])
    traffic = fused_traffic(g)
    assert traffic[a].writes == (True,) and traffic[y] == HbmTraffic.unfused(g.nodes[y][OP_ATTR])
    assert traffic[b].reads == (True, True) and traffic[a].launches and traffic[b].launches


def test_a_saved_activation_and_a_loop_carry_are_written_whatever_reads_them():
    g = new_op_graph("passes")
    x = add_input(g, t(64, 64), label="x")
    forward = unary(g, x, repeat=4)
    backward = unary(g, forward, scope="transpose(jvp())", repeat=4)
    after_loop = unary(g, backward)
    traffic = fused_traffic(g)
    assert traffic[forward].writes == (True,) and traffic[backward].writes == (True,)
    assert traffic[backward].reads == (True,) and traffic[after_loop].reads == (True,)


def test_broadcasts_and_widening_converts_are_recomputed_in_the_fusions_reading_them():
    g = new_op_graph("softmax-ish")
    scores = add_input(g, t(64, 64), label="scores")
    bias = add_input(g, t(64, dtype="float32"), label="bias")
    wide = unary(g, scores, "convert_element_type", out_dtype="float32")
    big = add_op(g, OpNode(primitive="broadcast_in_dim", inputs=(t(64, dtype="float32"),), outputs=(t(64, 64, dtype="float32"),)),
                 [(bias, 0)])
    total = add_op(g, OpNode(primitive="add", inputs=(t(64, 64, dtype="float32"),) * 2, outputs=(t(64, 64, dtype="float32"),)),
                   [(wide, 0), (big, 0)])
    narrow = unary(g, total, "convert_element_type", dtype="float32", out_dtype="bfloat16")
    traffic = fused_traffic(g)
    assert {wide, big} <= recomputed(g) and total not in recomputed(g)
    assert traffic[total].reads == (False, False)  # on chip: recomputed from the bf16 scores and the small bias
    assert traffic[wide].reads == (True,) and traffic[big].reads == (True,)
    assert not any(traffic[wide].writes + traffic[big].writes) and traffic[narrow].writes == (True,)


def test_renamings_alone_move_nothing():
    g = new_op_graph("reshape")
    x, w = add_input(g, t(64, 64), label="x"), add_input(g, t(64, 64), label="w")
    y = dot(g, x, w)
    r = add_op(g, OpNode(primitive="reshape", inputs=(t(64, 64),), outputs=(t(4096),)), [(y, 0)])
    assert fused_traffic(g)[r] == HbmTraffic(reads=(False,), writes=(False,), launches=False)  # the matmul's buffer, renamed


def test_a_tensor_saved_under_two_names_is_written_once():
    # jax.checkpoint's saved residual: the norm's result leaves the loop body both as itself and renamed.
    g = new_op_graph("two names")
    x = add_input(g, t(64, 64), label="x")
    norm = unary(g, x, "rsqrt")
    marked = unary(g, norm, "reduce_precision")
    named = unary(g, marked, "name")
    g.graph["outputs"] = [(norm, 0), (named, 0)]
    traffic = fused_traffic(g)
    assert traffic[norm].writes == (True,) and traffic[marked].writes == (False,) and traffic[named].writes == (False,)
    assert sum(sum(traffic[n].reads) for n in (norm, marked, named)) == 1


def test_a_renamed_outside_buffer_is_read_once_under_both_names():
    g = new_op_graph("one buffer")
    x = add_input(g, t(64, 64), label="x")
    alias = unary(g, x, "reshape")
    c = add_op(g, OpNode(primitive="mul", inputs=(t(64, 64), t(64, 64)), outputs=(t(64, 64),)), [(alias, 0), (x, 0)])
    traffic = fused_traffic(g)
    assert traffic[alias].writes == (False,) and sum(sum(traffic[n].reads) for n in (alias, c)) == 1
