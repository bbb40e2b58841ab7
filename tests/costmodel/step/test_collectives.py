"""Tests `costmodel/step/collectives.py`: ring and hierarchical alpha-beta costs."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.step.collectives import (
    Collective,
    Group,
    Tier,
    all_gather_s,
    all_reduce_s,
    all_to_all_s,
    collective_s,
    p2p_s,
    reduce_scatter_s,
    torus_ring_steps,
)

NVLINK = Tier(bytes_per_s=300e9, latency_s=5e-6)
IB = Tier(bytes_per_s=25e9, latency_s=10e-6)


def test_flat_ring_matches_closed_form():
    group = Group(n=8, n_nodes=1, intra=NVLINK, inter=IB)
    assert all_reduce_s(1e9, group) == pytest.approx(2 * 7 / 8 * 1e9 / 300e9 + 2 * 7 * 5e-6)
    assert all_gather_s(1e9, group) == pytest.approx(reduce_scatter_s(1e9, group))
    assert all_reduce_s(1e9, group) == pytest.approx(all_gather_s(1e9, group) + reduce_scatter_s(1e9, group))


def test_one_member_per_node_is_limited_by_the_nic():
    group = Group(n=32, n_nodes=32, intra=NVLINK, inter=IB)
    assert all_reduce_s(1e9, group) == pytest.approx(2 * 31 / 32 * 1e9 / 25e9 + 2 * 31 * 10e-6)


def test_hierarchical_uses_every_nic_of_a_node():
    full_nodes = Group(n=32, n_nodes=4, intra=NVLINK, inter=IB)
    one_per_node = Group(n=4, n_nodes=4, intra=NVLINK, inter=IB)
    # 8 NICs share the inter-node phase: about 8× less inter-node time than one NIC.
    inter_only = all_reduce_s(1e9, full_nodes) - all_reduce_s(1e9, Group(n=8, n_nodes=1, intra=NVLINK, inter=IB))
    assert inter_only == pytest.approx(all_reduce_s(1e9 / 8, one_per_node))


def test_torus_wraparound_doubles_ring_bandwidth():
    torus = Tier(bytes_per_s=50e9, latency_s=0.0, bidirectional_ring=True)
    line = Tier(bytes_per_s=50e9, latency_s=0.0)
    assert all_gather_s(1e9, Group(n=4, n_nodes=1, intra=torus, inter=torus)) == pytest.approx(
        all_gather_s(1e9, Group(n=4, n_nodes=1, intra=line, inter=line)) / 2
    )


def test_a_torus_group_pays_one_ring_latency_per_dimension_it_spans():
    # 64 chips of a 4x4x4 slice: three rings of 4, 9 latency steps a pass, not one ring's 63.
    torus = Tier(bytes_per_s=50e9, latency_s=1e-6, bidirectional_ring=True, torus_dims=(4, 4, 4))
    assert [torus_ring_steps(n, stride, (4, 4, 4)) for n, stride in ((64, 1), (4, 1), (4, 4), (16, 4), (2, 32))] == [9, 3, 3, 6, 1]
    ring, three_rings = (all_reduce_s(1e3, Group(n=64, n_nodes=1, intra=torus, inter=torus, ring_steps=s)) for s in (None, 9))
    assert ring - three_rings == pytest.approx(2 * (63 - 9) * 1e-6)


def test_trivial_cases_cost_nothing():
    solo = Group(n=1, n_nodes=1, intra=NVLINK, inter=IB)
    assert all_reduce_s(1e9, solo) == all_to_all_s(1e9, solo) == 0.0
    assert p2p_s(0, IB) == 0.0
    assert collective_s(Collective.P2P, 25e9, Group(n=2, n_nodes=2, intra=NVLINK, inter=IB)) == pytest.approx(1 + 10e-6)


@settings(derandomize=True, database=None, deadline=None)
@given(
    size=st.floats(1e3, 1e11), nodes=st.integers(1, 16), per_node=st.sampled_from([1, 2, 4, 8]),
    kind=st.sampled_from(list(Collective)), scale=st.floats(1.0, 10.0),
)
def test_more_bandwidth_is_never_slower(size, nodes, per_node, kind, scale):
    slow = Group(n=nodes * per_node, n_nodes=nodes, intra=NVLINK, inter=IB)
    fast = Group(n=nodes * per_node, n_nodes=nodes, intra=Tier(bytes_per_s=300e9 * scale, latency_s=5e-6),
                 inter=Tier(bytes_per_s=25e9 * scale, latency_s=10e-6))
    assert 0 <= collective_s(kind, size, fast) <= collective_s(kind, size, slow)
    assert collective_s(kind, size, slow) <= collective_s(kind, 2 * size, slow)
