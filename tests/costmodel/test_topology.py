"""Tests `costmodel/topology.py`: parallel groups on nodes."""

import pytest

from costmodel.collectives import Tier
from costmodel.layout import Layout
from costmodel.topology import layout_groups, link_between_stages

NV, IB = Tier(bytes_per_s=3e11, latency_s=0), Tier(bytes_per_s=2.5e10, latency_s=0)


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        (Layout(dp=32), {"tp": (1, 1), "dp": (32, 4)}),
        (Layout(tp=8, dp=4), {"tp": (8, 1), "dp": (4, 4)}),
        (Layout(tp=2, dp=16), {"tp": (2, 1), "dp": (16, 4)}),
        (Layout(tp=16, dp=2), {"tp": (16, 2), "dp": (2, 2)}),
        (Layout(tp=4, cp=2, dp=2, pp=2), {"tp": (4, 1), "cp": (2, 1), "dp": (2, 2), "pp": (2, 2)}),
    ],
)
def test_group_sizes_and_nodes_spanned(layout, expected):
    groups = layout_groups(layout, devices_per_node=8, intra=NV, inter=IB)
    for axis, (n, nodes) in expected.items():
        assert (groups[axis].n, groups[axis].n_nodes) == (n, nodes), axis


def test_pipeline_sends_cross_nodes_once_a_stage_fills_a_node():
    assert link_between_stages(Layout(tp=2, pp=4), devices_per_node=8, intra=NV, inter=IB) is NV
    assert link_between_stages(Layout(tp=8, pp=4), devices_per_node=8, intra=NV, inter=IB) is IB
