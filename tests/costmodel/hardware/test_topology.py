"""Tests `costmodel/hardware/topology.py`: parallel groups on nodes."""

import pytest

from costmodel.hardware.topology import layout_groups, link_between_stages
from costmodel.inputs.layout import Layout
from costmodel.step.collectives import Tier

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


def test_groups_and_stages_off_their_rail_take_the_cross_rail_tier():
    spine = Tier(bytes_per_s=1.25e10, latency_s=0)
    aligned = layout_groups(Layout(tp=4, dp=2, pp=3), devices_per_node=8, intra=NV, inter=IB, inter_cross_rail=spine)
    assert aligned["pp"].n_nodes == 3 and aligned["pp"].inter is IB  # stages 8 devices apart: the same local rank
    off_rail = layout_groups(Layout(tp=12, dp=2), devices_per_node=8, intra=NV, inter=IB, inter_cross_rail=spine)
    assert off_rail["dp"].inter is spine  # ranks 0 and 12: rank 4 of the next node
    assert link_between_stages(Layout(tp=12, pp=2), devices_per_node=8, intra=NV, inter=IB, inter_cross_rail=spine) is spine
    assert link_between_stages(Layout(tp=16, pp=2), devices_per_node=8, intra=NV, inter=IB, inter_cross_rail=spine) is IB
