"""Tests `costmodel/step/nccl.py`: NCCL's tuning model, its latencies, bandwidths and choice."""

import pytest

from costmodel.step.collectives import Group, Tier
from costmodel.step.nccl import BASE_LATENCY_US, NVLINK_HOP_US, Algorithm, Protocol, candidates, nccl_choice

NVLINK, IB = Tier(bytes_per_s=360e9, latency_s=1e-6), Tier(bytes_per_s=40e9, latency_s=5e-6)
NODE = Group(n=8, n_nodes=1, intra=NVLINK, inter=IB)
TWO_NODES = Group(n=16, n_nodes=2, intra=NVLINK, inter=IB)


def test_a_tiny_message_pays_the_low_latency_protocols_constant_and_hops():
    choice = nccl_choice("all_reduce", 8, NODE, nvls=False, algorithm="ring")
    assert choice.protocol == "LL"
    ring_ll = ("ring", "LL")
    assert choice.seconds == pytest.approx((BASE_LATENCY_US[_key(ring_ll)] + 14 * NVLINK_HOP_US[_key(ring_ll)]) * 1e-6, rel=1e-3)


def test_large_messages_go_to_nvls_where_the_switch_reduces_and_to_a_simple_ring_where_it_does_not():
    assert nccl_choice("all_reduce", 2**30, NODE, nvls=True).algorithm == "nvls"
    plain = nccl_choice("all_reduce", 2**30, NODE, nvls=False)
    assert (plain.algorithm, plain.protocol) == ("ring", "Simple")
    # A Simple ring's all-reduce moves 2(n-1)/n of the buffer at the link's rate, after its 8.4 + 14 · 3.4 µs.
    assert plain.seconds == pytest.approx(2 * 7 / 8 * 2**30 / 360e9 + (8.4 + 14 * 3.4) * 1e-6, rel=1e-3)


def test_across_nodes_a_ring_runs_at_the_nodes_nics_together_and_trees_and_nvls_trees_are_weighed():
    ring = nccl_choice("all_gather", 2**33, TWO_NODES, nvls=False, algorithm="ring")
    assert ring.seconds == pytest.approx(15 / 16 * 2**33 / (8 * 40e9), rel=0.01)  # 320 GB/s of NICs, under NVLink's 360
    assert {a for a, _ in candidates("all_reduce", TWO_NODES, nvls=True)} == {"ring", "tree", "nvlstree"}
    with pytest.raises(ValueError, match="no tree all_gather"):
        nccl_choice("all_gather", 1e6, TWO_NODES, nvls=True, algorithm="tree")


def _key(pair):
    return Algorithm(pair[0]), Protocol(pair[1])
