"""The rule-based (Megatron) layout in the intra-op strategy space, and the simulator's view of the same program."""

import jax
import pytest
from jax.sharding import PartitionSpec

from costmodel.hardware.machine import load_machine
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import stack_with
from costmodel.inputs.train_config import TrainConfig
from costmodel.oplevel.op_time import op_time_breakdown
from costmodel.oplevel.opgraph import OP_ATTR
from costmodel.oplevel.strategy_space import build_space
from costmodel.step.collectives import all_reduce_s
from costmodel.step.layer_costs import layer_costs
from planner.intraop.ilp import solve_intra_op
from planner.intraop.rule_based import rule_based_space
from planner.intraop.stage import stage_estimate, stage_graph, train_step_memory_factor

SMALL = ModelConfig(name="small", hidden_size=2048, num_layers=4, num_heads=16, num_kv_heads=4, ffn_size=8192, vocab_size=8192)
TRAIN = TrainConfig(seq_len=1024, global_batch=32)
HW = load_machine("a100-80gb")


def _megatron_space(layout):
    graph, abstract = stage_graph(SMALL, TRAIN, layout)
    space = build_space(graph, HW.mesh_groups([("data", layout.dp), ("tensor", layout.tp)]), HW,
                        memory_factor=train_step_memory_factor)
    column = {"wq", "wk", "wv", "w_in", "w_gate"}
    specs = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(abstract)[0]:
        label, name = jax.tree_util.keystr(path), str(path[-1].key)
        if label.startswith("[2]"):
            specs[label] = PartitionSpec("data")
        elif name in column:
            specs[label] = PartitionSpec(*(None,) * 2, "tensor")  # [layers, d, heads or f]
        elif name in ("wo", "w_out"):
            specs[label] = PartitionSpec(None, "tensor")
        else:
            specs[label] = PartitionSpec()
    megatron = rule_based_space(graph, space, specs, batch=[k for k in specs if k.startswith("[2]")], data_axes=("data",),
                                tensor_axes=("tensor",))
    return graph, megatron


def test_pinned_inputs_keep_their_specs_and_matmuls_split_the_batch_over_data():
    graph, megatron = _megatron_space(Layout(dp=2, tp=2, micro_batch=2))
    for n, options in megatron.strategies.items():
        op = graph.nodes[n][OP_ATTR]
        if op.is_input:
            assert len(options) == 1
        elif op.primitive == "dot_general" and not op.is_backward and "layer" in op.scope:
            assert all("data" in s.operands[0][0] or "data" in s.operands[1][0] for s in options), op.scope


def test_the_rule_based_op_level_time_is_close_to_the_simulated_one():
    layout = Layout(dp=2, tp=2, micro_batch=2, recompute="full", stack=stack_with("jax", attention="materialized"))
    graph, megatron = _megatron_space(layout)
    solution = solve_intra_op(megatron, memory_budget_bytes=2.0**50, time_limit_s=20)
    parts = op_time_breakdown(graph, megatron, solution.choice)
    simulated = stage_estimate(SMALL, TRAIN, layout, HW)
    assert parts.total_s == pytest.approx(solution.objective_s)
    assert parts.matmul_s == pytest.approx(simulated.breakdown.compute_s + simulated.breakdown.recompute_s, rel=0.1)
    assert solution.objective_s == pytest.approx(simulated.step_time_s, rel=0.15)


def test_both_granularities_count_the_same_tensor_parallel_reductions_per_layer():
    # The traced program has one matmul per weight matrix: forward reduces wo's and w_out's
    # outputs, full recompute wo's again, backward the input gradients of wq, wk, wv, w_in
    # and w_gate: 8 all-reduces of [tokens, D] (or reduce-scatters, gathered later) per layer.
    layout = Layout(dp=2, tp=2, micro_batch=2, recompute="full", stack=stack_with("jax", attention="materialized"))
    graph, megatron = _megatron_space(layout)
    choice = solve_intra_op(megatron, memory_budget_bytes=2.0**50, time_limit_s=20).choice
    activation_BxSxD = (layout.dp * layout.micro_batch, TRAIN.seq_len, SMALL.hidden_size)
    reductions = 0
    for n, data in graph.nodes(data=True):
        op = data[OP_ATTR]
        if (op.repeat == SMALL.num_layers and op.outputs and op.outputs[0].shape == activation_BxSxD
                and (n in megatron.strategies or n in megatron.followers)):
            name = megatron.chosen(n, choice).name
            reductions += name.count("all-reduce(tensor)") + name.count("reduce-scatter(tensor)")
    layer = layer_costs(SMALL, TRAIN, layout, HW)
    one_s = all_reduce_s(layout.micro_batch * TRAIN.seq_len * SMALL.hidden_size * 2, HW.groups(layout)["tp"])
    assert reductions == 8
    assert layer.tp_forward_s + layer.tp_backward_s == pytest.approx(reductions * one_s)


def test_data_axes_split_the_batch_of_the_expert_buffers_not_the_experts():
    # The router's argmax, stack and scatter carry the batch dimension where their loop nests do not
    # track it; lost there, the data axis took the expert dimension of the dispatched tokens and the
    # expert weights (expert parallelism over data), and the experts' gradient reduction went uncosted.
    moe = SMALL.model_copy(update={"num_experts": 4, "experts_per_token": 2, "moe_ffn_size": 1024})
    layout = Layout(dp=2, tp=2, micro_batch=2, recompute="full", stack=stack_with("jax", attention="materialized"))
    graph, abstract = stage_graph(moe, TRAIN, layout)
    space = build_space(graph, HW.mesh_groups([("data", 2), ("tensor", 2)]), HW, memory_factor=train_step_memory_factor)
    specs = {jax.tree_util.keystr(path): PartitionSpec("data") if jax.tree_util.keystr(path).startswith("[2]") else PartitionSpec()
             for path, _ in jax.tree_util.tree_flatten_with_path(abstract)[0]}
    megatron = rule_based_space(graph, space, specs, batch=[k for k in specs if k.startswith("[2]")], data_axes=("data",),
                                tensor_axes=("tensor",))
    expert_dots = [n for n, d in graph.nodes(data=True) if d[OP_ATTR].primitive == "dot_general" and "moe" in d[OP_ATTR].scope
                   and len(d[OP_ATTR].inputs[0].shape) + len(d[OP_ATTR].inputs[1].shape) == 7 and n in megatron.strategies]
    assert expert_dots
    for n in expert_dots:
        op = graph.nodes[n][OP_ATTR]
        weight = [i for i, t in enumerate(op.inputs) if len(t.shape) == 3]
        for s in megatron.strategies[n]:
            assert all("data" not in axes for i in weight for axes in s.operands[i]), (op.scope, s.name)
