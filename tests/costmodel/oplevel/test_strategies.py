"""Per-op sharding strategies and resharding costs."""

import pytest

from costmodel.hardware.machine import load_machine
from costmodel.oplevel.fusion import HbmTraffic
from costmodel.oplevel.opgraph import LoopNest, OpNode, TensorSpec
from costmodel.oplevel.strategies import input_nest, op_strategies, partial_sums_s, reshard_s, shard_factor
from costmodel.step.collectives import Group, Tier, all_gather_s, all_reduce_s, all_to_all_s, combined, exposed_s, reduce_scatter_s

MACHINE = load_machine("a100-80gb")
TIER = Tier(bytes_per_s=1e11, latency_s=1e-6)


def group(n):
    return Group(n=n, n_nodes=1, intra=TIER, inter=TIER)


def t(*shape):
    return TensorSpec(shape=shape, dtype="bfloat16")


def matmul(m=4096, k=4096, n=4096):
    """x[m,k] @ w[k,n]; loops m, n, k (k summed)."""
    return OpNode(primitive="dot_general", inputs=(t(m, k), t(k, n)), outputs=(t(m, n),), flops=2 * m * k * n,
                  loops=LoopNest(sizes=(m, n, k), reduced=(False, False, True), operands=((0, 2), (2, 1)), results=((0, 1),)))


def by_name(strategies):
    return {s.name: s for s in strategies}


def test_contracting_split_pays_an_all_reduce_or_a_cheaper_reduce_scatter():
    groups = {"tensor": group(4)}
    s = by_name(op_strategies(matmul(), groups, MACHINE))
    reduce = s["[-,tensor]×[tensor,-] → [-,-] all-reduce(tensor)"]
    scatter = s["[-,tensor]×[tensor,-] → [tensor,-] reduce-scatter(tensor)"]
    assert reduce.communication_s == pytest.approx(all_reduce_s(4096 * 4096 * 2, groups["tensor"]))
    assert 0 < scatter.communication_s < reduce.communication_s
    assert s["[-,-]×[-,tensor] → [-,tensor]"].communication_s == 0


def test_splitting_divides_the_compute():
    s = by_name(op_strategies(matmul(), {"data": group(4)}, MACHINE))
    whole, split = s["[-,-]×[-,-] → [-,-]"].compute_s, s["[data,-]×[-,-] → [data,-]"].compute_s
    # A quarter of the work, run no more efficiently than the whole GEMM (smaller GEMMs reach less of peak).
    assert whole / 4 <= split < whole / 4 * 1.2


def test_two_axes_may_split_one_loop_and_indivisible_splits_are_dropped():
    groups = {"data": group(2), "tensor": group(4)}
    names = by_name(op_strategies(matmul(m=8, k=6, n=4096), groups, MACHINE))
    assert "[data·tensor,-]×[-,-] → [data·tensor,-]" in names
    assert not any("×[tensor," in n for n in names)  # k = 6 is not divisible by 4
    for strategy in names.values():
        for sharding, tensor in zip(strategy.operands, matmul(m=8, k=6, n=4096).inputs):
            assert all(size % shard_factor((axes,), {"data": 2, "tensor": 4}) == 0
                       for size, axes in zip(tensor.shape, sharding))


def test_inputs_hold_memory_by_their_factor_and_saved_results_count_per_repeat():
    param = OpNode(primitive="input", outputs=(t(1024, 1024),), label="w")
    s = by_name(op_strategies(param, {"data": group(4)}, MACHINE, memory_factor=3.0))
    assert s["[data,-]"].memory_bytes == pytest.approx(3.0 * 1024 * 1024 * 2 / 4)
    assert s["[-,-]"].memory_bytes == pytest.approx(3.0 * 1024 * 1024 * 2)
    looped = matmul(m=64, k=64, n=64).model_copy(update={"repeat": 10})
    replicated = op_strategies(looped, {"data": group(4)}, MACHINE, saved=True)[0]
    assert replicated.memory_bytes == pytest.approx(10 * 64 * 64 * 2)


def test_input_nest_covers_every_dimension():
    assert input_nest(t(3, 5)).results == ((0, 1),)
    assert input_nest(t()) is None


def test_reshard_costs_per_axis():
    groups = {"data": group(4), "tensor": group(2)}
    x = TensorSpec(shape=(1024, 1024), dtype="float32")
    nbytes = 1024 * 1024 * 4
    assert reshard_s(x, (("data",), ()), (("data",), ()), groups) == 0
    assert reshard_s(x, ((), ()), (("data",), ()), groups) == 0  # a local slice
    assert reshard_s(x, (("data",), ()), ((), ()), groups) == pytest.approx(all_gather_s(nbytes, groups["data"]))
    # Only the data axis moves; the tensor axis keeps its half, so half the bytes move.
    assert reshard_s(x, (("data",), ("tensor",)), ((), ("tensor",)), groups) == pytest.approx(
        all_gather_s(nbytes / 2, groups["data"]))
    assert reshard_s(x, (("data",), ()), ((), ("data",)), groups) == pytest.approx(all_to_all_s(nbytes / 4, groups["data"]))


def test_a_stacked_layer_dimension_must_be_gathered_for_each_slice():
    groups = {"data": group(4)}
    layer = TensorSpec(shape=(1024, 1024), dtype="float32")
    stacked_on_layers = (("data",), (), ())
    assert reshard_s(layer, stacked_on_layers, ((), ()), groups) == pytest.approx(all_gather_s(1024 * 1024 * 4, groups["data"]))
    assert reshard_s(layer, ((), ("data",), ()), (("data",), ()), groups) == 0


def test_a_gather_over_two_axes_is_one_collective_on_the_group_they_form():
    tier = Tier(bytes_per_s=1e11, latency_s=0)
    slow = Tier(bytes_per_s=1e10, latency_s=0)
    groups = {"across": Group(n=4, n_nodes=4, intra=tier, inter=slow), "within": Group(n=8, n_nodes=1, intra=tier, inter=slow)}
    x = TensorSpec(shape=(1024, 1024), dtype="float32")
    both = combined(list(groups.values()))
    assert (both.n, both.n_nodes) == (32, 4)
    assert reshard_s(x, (("across", "within"), ()), ((), ()), groups) == pytest.approx(all_gather_s(1024 * 1024 * 4, both))
    # Hierarchically: the slow tier carries an eighth of the bytes, not all of them.
    assert reshard_s(x, (("across", "within"), ()), ((), ()), groups) < (
        all_gather_s(1024 * 1024 * 4, groups["across"]) + all_gather_s(1024 * 1024 * 4, groups["within"]))


def test_partial_sums_over_two_axes_reduce_scatter_first_then_all_reduce_the_piece():
    groups = {"data": group(2), "tensor": group(4)}
    assert partial_sums_s(8e6, [groups["tensor"]], [groups["data"]]) == pytest.approx(
        reduce_scatter_s(8e6, groups["tensor"]) + all_reduce_s(2e6, groups["data"]))
    assert partial_sums_s(8e6, [], [groups["data"], groups["tensor"]]) == pytest.approx(
        all_reduce_s(8e6, combined([groups["data"], groups["tensor"]])))


def test_zero_over_two_axes_reduce_scatters_a_gradient_onto_one_dimension():
    groups = {"data": group(2), "fsdp": group(4)}
    dw = matmul(m=1024, k=4096, n=512)  # the summed loop k is the batch: a weight gradient
    names = by_name(op_strategies(dw, groups, MACHINE))
    assert "[-,data·fsdp]×[data·fsdp,-] → [data·fsdp,-] reduce-scatter(data) reduce-scatter(fsdp)" in names
    assert "[-,data·fsdp]×[data·fsdp,-] → [-,data·fsdp] reduce-scatter(data) reduce-scatter(fsdp)" in names


def test_a_gradients_reduction_hides_behind_its_kernel_save_the_overlap_slowdown():
    groups = {"data": group(4)}
    on_path = by_name(op_strategies(matmul(), groups, MACHINE))
    behind = by_name(op_strategies(matmul(), groups, MACHINE, gradient=True))
    name = "[-,data]×[data,-] → [-,-] all-reduce(data)"
    comm_s, kernel_s = on_path[name].communication_s, behind[name].compute_s
    assert behind[name].communication_s == pytest.approx(exposed_s(comm_s, kernel_s, MACHINE.efficiency.overlap_slowdown))
    assert 0 < behind[name].communication_s < comm_s


def test_fused_traffic_charges_only_what_reaches_hbm_and_no_launch_inside_a_fusion():
    op = OpNode(primitive="tanh", inputs=(t(1024, 1024),), outputs=(t(1024, 1024),),
                loops=LoopNest(sizes=(1024, 1024), reduced=(False, False), operands=((0, 1),), results=((0, 1),)))
    alone = op_strategies(op, {"data": group(4)}, MACHINE)[0]
    inside = op_strategies(op, {"data": group(4)}, MACHINE, traffic=HbmTraffic(reads=(False,), writes=(True,), launches=False))[0]
    floor_s = MACHINE.efficiency.kernel_floor_s
    assert alone.compute_s - floor_s == pytest.approx(2 * (inside.compute_s))
