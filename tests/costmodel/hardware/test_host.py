"""Tests `costmodel/hardware/host.py`: the host's link and CPU Adam rate, and the catalog's hosts."""

import pytest
from pydantic import ValidationError

from costmodel.hardware.host import ADAM_HOST_BYTES_PER_PARAM, HostSpec
from costmodel.hardware.registry import load_hardware


def test_catalog_hosts_are_the_datasheet_nodes():
    a100_40, a100_80, h100 = (load_hardware(n).host for n in ("a100-40gb", "dgx-a100", "h100-sxm"))
    assert (a100_40.memory_bytes_per_node, a100_80.memory_bytes_per_node, h100.memory_bytes_per_node) == (1e12, 2e12, 2e12)
    assert a100_40.link.name == "pcie4-x16" and h100.link.name == "pcie5-x16"
    assert a100_40.link_bytes_per_s == pytest.approx(25.6e9) and h100.link_bytes_per_s == pytest.approx(51.2e9)
    assert load_hardware("a40").host is None  # not described: offloading is refused there


def test_adam_rate_takes_the_binding_limit_per_device():
    host = load_hardware("h100-sxm").host
    dram_bound = 614.4e9 * host.dram_efficiency / ADAM_HOST_BYTES_PER_PARAM
    assert host.adam_params_per_s(devices_sharing=1) == pytest.approx(dram_bound)
    few_cores = host.model_copy(update={"cpu_cores_per_node": 2})
    assert few_cores.adam_params_per_s(devices_sharing=1) == pytest.approx(2 * host.adam_params_per_s_per_core)


def test_a_cluster_file_may_describe_an_nvlink_c2c_host():
    spec = {"memory_bytes_per_node": 480e9, "cpu_cores_per_node": 72, "dram_bytes_per_s_per_node": 500e9,
            "link": {"name": "nvlink-c2c", "bytes_per_s": 450e9, "latency_s": 1e-6, "efficiency": 0.9,
                     "source": "GH200: NVLink-C2C 900 GB/s bidirectional"}, "source": "GH200 datasheet"}
    assert HostSpec.model_validate(spec).link_bytes_per_s == pytest.approx(405e9)
    with pytest.raises(ValidationError):
        HostSpec.model_validate(spec | {"memory_bytes_per_node": -1})
