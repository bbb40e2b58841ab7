"""Tests `costmodel/step/offload.py`: ZeRO-Offload's bytes, overlap and host memory, from first principles."""

import pytest

from costmodel.errors import UnsupportedError
from costmodel.hardware.catalog import DGX_A100_320GB_HOST
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.offload import (
    REDUCE_BUCKET_ELEMENTS,
    activation_offload_s,
    check_offloadable,
    device_grad_bytes,
    host_memory,
    offload_times,
    param_host_memory,
    param_offload_times,
    require_host,
)

N = 8e9  # parameters of one device's partition
BF16 = TrainConfig()


def test_without_accumulation_gradients_go_down_in_fp32_and_parameters_up_in_bf16():
    t = offload_times(N, BF16, micro_batches=1, backward_s=100.0, overlap=True, host=DGX_A100_320GB_HOST, devices_sharing=1)
    assert (t.grads_to_host_bytes, t.grads_from_host_bytes, t.params_to_device_bytes) == (4 * N, 0.0, 2 * N)
    assert t.transfer_s == pytest.approx(6 * N / (32e9 * 0.8))  # PCIe Gen4 x16 at 80 %
    assert t.exposed_grads_s == 0.0 and t.exposed_transfer_s == t.params_to_device_s  # a long backward hides the gradients


def test_accumulation_round_trips_the_running_sum_every_micro_batch():
    m = 4
    t = offload_times(N, BF16, micro_batches=m, backward_s=0.0, overlap=True, host=DGX_A100_320GB_HOST, devices_sharing=1)
    assert t.grads_to_host_bytes == pytest.approx(m * 2 * N + 4 * N)
    assert t.grads_from_host_bytes == pytest.approx((m - 1) * 2 * N)
    # With no backward to hide behind, each micro-batch waits for its busier direction (down).
    assert t.exposed_grads_s == pytest.approx(t.grads_to_host_bytes / t.link_bytes_per_s)


def test_cpu_adam_is_bound_by_dram_on_a_full_node_and_by_cores_when_shared_thinly():
    alone = offload_times(N, BF16, micro_batches=1, backward_s=1.0, overlap=True, host=DGX_A100_320GB_HOST, devices_sharing=1)
    assert alone.cpu_adam_s == pytest.approx(N * 34 / (409.6e9 * 0.7))
    eight = offload_times(N, BF16, micro_batches=1, backward_s=1.0, overlap=True, host=DGX_A100_320GB_HOST, devices_sharing=8)
    assert eight.cpu_adam_s == pytest.approx(8 * alone.cpu_adam_s)


def test_host_memory_is_itemised_and_checked_against_its_capacity():
    mem = host_memory(N, BF16, micro_batches=2, capacity_bytes=100e9)
    assert (mem.master_weights_bytes, mem.moments_bytes, mem.grads_bytes, mem.param_copy_bytes, mem.accumulated_grads_bytes) == \
        (4 * N, 8 * N, 4 * N, 2 * N, 2 * N)
    assert mem.total_bytes == 20 * N and mem.fits is False
    assert host_memory(N, BF16, micro_batches=1, capacity_bytes=None).fits is None


def test_device_gradients_are_one_bucket_and_the_largest_parameter():
    assert device_grad_bytes(N, 1e8, BF16) == (REDUCE_BUCKET_ELEMENTS + 1e8) * 2
    assert device_grad_bytes(1e6, 1e5, BF16) == (1e6 + 1e5) * 2  # fewer gradients than a bucket


def test_refusals_name_the_fix():
    with pytest.raises(UnsupportedError, match="describes no host memory.*fix: use --offload none"):
        require_host(None, "a40")
    with pytest.raises(UnsupportedError, match="not decode"):
        check_offloadable(TrainConfig(workload="decode", global_batch=8))


def test_without_overlap_every_copy_of_the_backward_is_exposed():
    kw = {"micro_batches": 3, "backward_s": 100.0, "host": DGX_A100_320GB_HOST, "devices_sharing": 1}
    hidden = offload_times(N, BF16, overlap=True, **kw)
    queued = offload_times(N, BF16, overlap=False, **kw)
    assert hidden.exposed_grads_s == 0.0
    assert queued.exposed_grads_s == pytest.approx((queued.grads_to_host_bytes + queued.grads_from_host_bytes) / queued.link_bytes_per_s)


def test_parameter_offload_sends_every_shard_up_twice_a_micro_batch_and_hides_it_behind_the_compute():
    shard = 12.8e9  # bytes of one device's shards as stored
    kw = {"micro_batches": 3, "host": DGX_A100_320GB_HOST, "devices_sharing": 1}
    hidden = param_offload_times(1e8, shard, BF16, micro_batch_s=10.0, **kw)
    assert hidden.params_to_device_bytes == 3 * 2 * shard and hidden.grads_to_host_bytes == 3 * 1e8 * 4  # fp32 gradients
    assert hidden.exposed_transfer_s == 0.0 and hidden.params_to_device_s == 0.0  # the next step's gathers fetch the update
    short = param_offload_times(1e8, shard, BF16, micro_batch_s=0.25, **kw)
    assert short.exposed_grads_s == pytest.approx(3 * (2 * shard / (32e9 * 0.8) - 0.25))
    assert short.cpu_adam_s == pytest.approx(1e8 * 34 / (409.6e9 * 0.7))


def test_parameter_offload_host_memory_keeps_the_shards_as_stored():
    pure = TrainConfig(optimizer_state="bf16")  # torchtune's pure bf16: weights, gradients and moments in bf16
    mem = param_host_memory(N, 3e9, pure, capacity_bytes=None)
    assert (mem.master_weights_bytes, mem.grads_bytes, mem.moments_bytes, mem.frozen_weights_bytes) == (2 * N, 2 * N, 4 * N, 3e9)
    assert mem.total_bytes == 8 * N + 3e9


def test_offloaded_activations_cost_only_what_their_copies_outlast_the_compute():
    gb = 25.6e9  # one second each way over PCIe Gen4 x16 at 80 %
    assert activation_offload_s(gb, micro_batches=4, forward_s=1.5, backward_s=3.0, host=DGX_A100_320GB_HOST) == 0.0
    assert activation_offload_s(gb, micro_batches=4, forward_s=0.25, backward_s=0.5, host=DGX_A100_320GB_HOST) == \
        pytest.approx(4 * (0.75 + 0.5))
