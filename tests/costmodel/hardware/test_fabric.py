"""Tests `costmodel/hardware/fabric.py` and the cluster JSON a user writes: NIC shares, rails, the spine,
NVLink pairs, and one-line errors on bad files."""

import json
import re
from pathlib import Path

import pytest

from costmodel.errors import InvalidConfigError
from costmodel.hardware.fabric import InterNodeFabric
from costmodel.hardware.machine import machine_for
from costmodel.hardware.registry import load_hardware
from costmodel.hardware.topology import placement
from costmodel.step.collectives import all_reduce_s

CLUSTERS_DOC = Path(__file__).resolve().parents[3] / "docs" / "clusters.md"


def _documented_cluster() -> dict:
    section = CLUSTERS_DOC.read_text().split("## Describing a cluster", 1)[1]
    return json.loads(re.search(r"```json\n(.*?)```", section, re.S).group(1))


def _write(tmp_path, doc) -> str:
    path = tmp_path / "cluster.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


def _network(**facts) -> InterNodeFabric:
    base = {"name": "ib", "nics_per_node": 8, "nic_gbit_per_s": 400, "rail_optimized": True, "latency_s": 5e-6, "efficiency": 0.9,
            "source": "test"}
    return InterNodeFabric(**{**base, **facts})


def test_the_documented_cluster_loads_with_the_facts_it_states(tmp_path):
    cluster = load_hardware(_write(tmp_path, _documented_cluster()))
    assert cluster.name == "my-h100-roce" and cluster.device == load_hardware("h100-sxm").device  # named, not spelled out
    # 4 × 400 Gb/s over 8 GPUs = 25 GB/s each, halved by the 2:1 spine, × 0.8 efficiency.
    assert cluster.inter_tier().bytes_per_s == pytest.approx(10e9)
    assert "not rail-optimised, spine 2:1 oversubscribed, 12.5 GB/s per device" in cluster.summary()


def test_nic_share_is_nics_times_speed_over_devices():
    assert _network(nics_per_node=4, nic_gbit_per_s=100).bytes_per_s_per_device(8) == 4 * 100e9 / 8 / 8
    assert _network(nics_per_node=32, nic_gbit_per_s=100).bytes_per_s_per_device(8) == 400e9 / 8  # more NICs than GPUs


def test_rail_optimised_network_is_faster_for_an_inter_node_all_reduce():
    rail, tor = _network(spine_oversubscription=2), _network(rail_optimized=False, spine_oversubscription=2)
    group = machine_for(load_hardware("dgx-h100")).mesh_groups([("data", 4), ("tensor", 8)])["data"]
    on_rail = all_reduce_s(1e9, group.model_copy(update={"inter": rail.tier(8)}))
    through_spine = all_reduce_s(1e9, group.model_copy(update={"inter": tor.tier(8)}))
    assert through_spine > on_rail
    # A non-blocking spine carries the same traffic at the NIC rate: rail optimisation then changes nothing here.
    assert _network(rail_optimized=False).tier(8) == _network().tier(8)


def test_groups_across_rails_take_the_spine_on_a_rail_optimised_network():
    assert placement(8, 4, 8).rail_aligned and placement(2, 16, 8).rail_aligned
    assert not placement(4, 3, 8).rail_aligned and not placement(2, 12, 8).rail_aligned
    cluster = load_hardware("dgx-h100").model_copy(update={"inter_node": _network(spine_oversubscription=4)})
    m = machine_for(cluster)
    aligned = m.mesh_groups([("data", 2), ("tensor", 8)])["data"]
    across_rails = m.mesh_groups([("data", 2), ("tensor", 12)])["data"]  # rank 0 of node 0 meets rank 4 of node 1
    assert aligned.inter == cluster.inter_tier() and across_rails.inter == cluster.inter_tier(rail_aligned=False)
    assert across_rails.inter.bytes_per_s == aligned.inter.bytes_per_s / 4


def test_nvlink_pairs_bridge_a_pair_and_pcie_carries_the_rest():
    m = machine_for(load_hardware("a100-pcie-server"))
    groups = m.mesh_groups([("data", 4), ("pair", 2)])
    assert groups["pair"].intra == m.intra_pair and groups["pair"].intra.bytes_per_s > 5 * m.intra.bytes_per_s
    assert groups["data"].intra == m.intra  # devices 0, 2, 4, 6: not bridged to each other
    assert m.mesh_groups([("tensor", 8)])["tensor"].intra == m.intra  # a ring of 8 crosses PCIe


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.update(device="h900"), r"device: Value error, unknown device 'h900' \(known: .*h100-sxm"),
    (lambda d: d["intra_node"].update(kind="nvlink-pairs"), "intra_node: Value error, pair_link is given exactly when kind is "
                                                            "nvlink-pairs"),
    (lambda d: d["intra_node"].update(kind="ici-torus"), "torus_dims is given exactly when kind is ici-torus"),
    (lambda d: d["intra_node"].update(kind="nvlink"), "intra_node.kind: Input should be 'nvswitch', 'nvlink-pairs'"),
    (lambda d: d["inter_node"].update(nics_per_node=0), "inter_node.nics_per_node: Input should be greater than 0"),
    (lambda d: d["inter_node"].update(nic_gbit_per_s="fast"), "inter_node.nic_gbit_per_s: Input should be a valid number"),
    (lambda d: d["inter_node"].update(spine_oversubscription=0.5), "inter_node.spine_oversubscription: Input should be greater than"),
    (lambda d: d["inter_node"].pop("rail_optimized"), "inter_node.rail_optimized: Field required"),
    (lambda d: d.update(devices_per_node=2**40), "devices_per_node: Input should be less than or equal to 16777216"),
])
def test_a_bad_cluster_file_gets_one_line_naming_the_field(tmp_path, change, message):
    doc = _documented_cluster()
    change(doc)
    path = _write(tmp_path, doc)
    with pytest.raises(InvalidConfigError) as err:
        load_hardware(path)
    assert re.search(message, str(err.value)) and "\n" not in str(err.value)
    assert str(err.value).startswith(f"{path}: ") and str(err.value).endswith("fix: see docs/clusters.md 'Describing a cluster' "
                                                                              "(costmodel.hardware.profile.ClusterSpec)")
