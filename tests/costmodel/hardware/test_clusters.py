"""Tests `costmodel/hardware/clusters.py`: the C3SE Alvis presets (the vendor presets are in test_hardware.py)."""

import pytest

from costmodel.errors import InvalidConfigError
from costmodel.hardware.clusters import ALVIS, CLUSTERS
from costmodel.hardware.machine import machine_for
from costmodel.hardware.mesh import axis_links, parse_mesh
from costmodel.hardware.registry import load_hardware

ALVIS_NAMES = ["alvis-a100", "alvis-a100fat", "alvis-a40", "alvis-t4", "alvis-v100"]


def test_every_alvis_node_type_is_a_preset():
    assert sorted(c.name for c in ALVIS) == ALVIS_NAMES
    assert all(CLUSTERS[c.name] is c for c in ALVIS)


@pytest.mark.parametrize(
    ("name", "device", "per_node", "intra_kind"),
    [("alvis-a100", "a100-40gb", 4, "nvswitch"), ("alvis-a100fat", "a100-80gb", 4, "nvswitch"),
     ("alvis-a40", "a40", 4, "pcie"), ("alvis-v100", "v100", 4, "nvswitch"), ("alvis-t4", "t4", 8, "pcie")],
)
def test_alvis_node_facts(name, device, per_node, intra_kind):
    cluster = load_hardware(name)
    assert (cluster.device.name, cluster.devices_per_node, cluster.intra_node.kind) == (device, per_node, intra_kind)
    assert "assumed" in cluster.description + cluster.inter_node.source  # what no document gave is labelled


def test_alvis_networks_follow_the_issue():
    # "4× A100 nodes on 100 Gb/s InfiniBand; A40, V100 and T4 nodes on 25 Gb/s Ethernet", one port per node.
    assert load_hardware("alvis-a100").inter_node.bytes_per_s_per_device(4) == 100e9 / 8 / 4
    assert load_hardware("alvis-a100fat").inter_node.nic_gbit_per_s == 100
    for name in ("alvis-a40", "alvis-v100", "alvis-t4"):
        cluster = load_hardware(name)
        assert (cluster.inter_node.nic_gbit_per_s, cluster.inter_node.name) == (25, "eth-25g")
    assert load_hardware("alvis-t4").inter_node.bytes_per_s_per_device(8) == 25e9 / 8 / 8


def test_alvis_nodes_are_slower_across_than_the_dgx_they_resemble():
    across_alvis = machine_for(load_hardware("alvis-a100fat")).inter.bytes_per_s
    across_dgx = machine_for(load_hardware("dgx-a100")).inter.bytes_per_s
    assert across_alvis == pytest.approx(across_dgx / 8)  # 100 Gb/s per 4 GPUs against 200 Gb/s per GPU


def test_the_site_name_alone_names_its_node_types():
    with pytest.raises(InvalidConfigError, match="'alvis' has several node types; fix: name one: alvis-a100, alvis-a100fat"):
        load_hardware("alvis")


def test_mesh_axes_on_alvis_say_what_they_cross():
    # What `plan inspect --mesh 2x4 --hardware alvis-a100` prints: nodes of 4, so axis0 leaves the node.
    links = axis_links(parse_mesh("2x4"), load_hardware("alvis-a100"))
    assert "across 2 nodes" in links["axis0"].crosses and "100 Gb/s" in links["axis0"].crosses
    assert links["axis0"].inter_bytes_per_s == pytest.approx(100e9 / 8 / 4 * 0.9)  # one HCA per 4 GPUs, 90 % efficient
    assert "within a node" in links["axis1"].crosses and links["axis1"].inter_bytes_per_s is None
