"""Rows of the summary tables that ``plan`` and ``plan simulate`` both print: the workload's
title, the memory breakdown, a serving plan's latencies, offloading's costs."""

from __future__ import annotations

import math

from costmodel.errors import InvalidConfigError
from costmodel.hardware.registry import load_hardware
from costmodel.inputs.layout import Layout, Offload
from costmodel.inputs.train_config import Precision, TrainConfig
from costmodel.step.estimate import StepEstimate
from costmodel.step.memory import MemoryBreakdown
from planner.plan_schema import Plan
from planner.programs.xla_options import compile_options, xla_flags

_GIB = 2**30


def workload_label(train: TrainConfig) -> str:
    """``pretrain``, or LoRA's or serving's settings in a few words.

    >>> workload_label(TrainConfig(workload="finetune-lora"))
    'finetune-lora: rank 16 on attn, frozen weights bf16'
    >>> workload_label(TrainConfig(workload="decode", global_batch=64, seq_len=4096))
    'decode: batch 64, context 4096, weights bf16'
    """
    return train.workload.describe(global_batch=train.global_batch, seq_len=train.seq_len)


def titled_workload(train: TrainConfig) -> str:
    """`` (workload ..., precision)`` after a model's name in a title; nothing for bf16 pretraining, the default.

    >>> titled_workload(TrainConfig().with_precision(Precision.FP8))
    ' (fp8)'
    >>> titled_workload(TrainConfig(workload="finetune-full", optimizer_state="8bit", optimizer_in_backward=True))
    ' (finetune-full, 8bit optimizer state, step in backward)'
    >>> titled_workload(TrainConfig(seq_len=4096, document_len=512))
    ' (packed documents of 512 tokens)'
    """
    parts = [workload_label(train)] if train.workload.named_in_titles else []
    parts += [train.precision.value] if train.precision is not Precision.BF16 else []
    parts += [f"{train.optimizer_state.value} optimizer state"] if train.optimizer_state != "fp32" else []
    parts += ["step in backward"] if train.optimizer_in_backward else []
    parts += [f"packed documents of {train.document_len} tokens"] if train.document_len is not None else []
    return f" ({', '.join(parts)})" if parts else ""


def memory_rows(mem: MemoryBreakdown, *, lora: bool, digits: int, state: str = "params / grads / optimizer") -> list[tuple[str, str]]:
    """The memory breakdown's rows of a summary, in GiB; LoRA's frozen weights, adapters and their state apart."""
    def gib(*values: float) -> str:
        return " / ".join(f"{v / _GIB:.{digits}f}" for v in values) + " GiB"

    row = (("  frozen weights / adapters / grads / optimizer",
            gib(mem.frozen_params_bytes, mem.params_bytes - mem.frozen_params_bytes, mem.grads_bytes, mem.optimizer_bytes))
           if lora else (f"  {state}", gib(mem.params_bytes, mem.grads_bytes, mem.optimizer_bytes)))
    return [row, ("  activations / temporary", gib(mem.activations_bytes, mem.temporary_bytes))]


def memory_total_row(mem: MemoryBreakdown, *, digits: int = 1) -> tuple[str, str]:
    """The per-device peak against the usable memory and the runtime reserve a plan leaves free.

    >>> memory_total_row(MemoryBreakdown(stage="only", params_bytes=2**30, grads_bytes=0, optimizer_bytes=0, activations_bytes=0,
    ...                                  temporary_bytes=0, hbm_bytes=80 * 2**30, reserve_bytes=4 * 2**30))
    ('memory per device', '1.0 GiB of 80.0 GiB usable (4.0 GiB reserved)')
    """
    if mem.hbm_bytes is None:
        return "memory per device", f"{mem.total_bytes / _GIB:.{digits}f} GiB"
    reserved = f" ({mem.reserve_bytes / _GIB:.1f} GiB reserved)" if mem.reserve_bytes else ""
    return "memory per device", f"{mem.total_bytes / _GIB:.{digits}f} GiB of {mem.hbm_bytes / _GIB:.1f} GiB usable{reserved}"


JAX_DEFAULT_MEM_FRACTION = 0.75
"""The share of a GPU's memory JAX preallocates unless XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise
(JAX's "GPU memory allocation" page)."""


def jax_memory_row(mem: MemoryBreakdown) -> tuple[str, str] | None:
    """What to set XLA_PYTHON_CLIENT_MEM_FRACTION to for the plan's peak (None: the usable memory is unknown).

    >>> jax_memory_row(MemoryBreakdown(stage="only", params_bytes=64 * 2**30, grads_bytes=0, optimizer_bytes=0,
    ...                                activations_bytes=0, temporary_bytes=0, hbm_bytes=80 * 2**30))[1][:36]
    'XLA_PYTHON_CLIENT_MEM_FRACTION=0.80:'
    """
    if not mem.hbm_bytes:
        return None
    need = math.ceil(100 * mem.total_bytes / mem.hbm_bytes) / 100
    default_gib = JAX_DEFAULT_MEM_FRACTION * mem.hbm_bytes / _GIB
    if need <= JAX_DEFAULT_MEM_FRACTION:
        return "JAX preallocation", (f"the default XLA_PYTHON_CLIENT_MEM_FRACTION={JAX_DEFAULT_MEM_FRACTION} ({default_gib:.1f} GiB) "
                                     "holds the peak")
    return "JAX preallocation", (f"XLA_PYTHON_CLIENT_MEM_FRACTION={need:.2f}: the peak is {need:.0%} of usable memory, JAX's "
                                 f"default {JAX_DEFAULT_MEM_FRACTION} preallocates {default_gib:.1f} GiB")


def xla_flags_row(layout: Layout, hardware: str) -> tuple[str, str] | None:
    """The XLA_FLAGS the prediction assumes the program runs with on ``hardware`` (None: none needed, or a profile
    this process cannot load).

    >>> xla_flags_row(Layout(tp=8, sequence_parallel=True), "h100-sxm")[1][:52]
    'XLA_FLAGS="--xla_gpu_threshold_for_windowed_einsum_m'
    """
    try:
        kind = load_hardware(hardware).device.kind
    except InvalidConfigError:
        return None
    options = compile_options(layout, kind.value)  # a DeviceKind is named as jax names its platform
    if not options:
        return None
    return "XLA flags", (f'XLA_FLAGS="{xla_flags(options)}"   (XLA\'s collective matmul: the tensor-parallel gathers and '
                         "reduce-scatters pipelined with their GEMMs, as predicted; `plan validate` on GPUs compiles with them)")


def utilisation_row(est: StepEstimate) -> tuple[str, str]:
    """MFU and HFU, with what they count in a few words (docs/commands.md "MFU" and `costmodel.workloads.flops` in full)."""
    return "MFU / HFU", f"{est.mfu:.1%} / {est.hfu:.1%}   (model FLOPs 6·N + causal attention)"


def serving_rows(p: Plan) -> list[tuple[str, str]]:
    """The summary rows of a serving plan: latencies, throughput, memory with the KV cache, and why this layout when a
    search chose it."""
    est, mem, srv, train = p.predicted, p.predicted.memory, p.predicted.serving, p.train
    lay = p.layout
    decode = train.workload.of_step(decode=True, prefill=False)
    return [
        ("time per output token", f"{est.time_per_output_token_s * 1e3:.2f} ms   ({srv.decode_bound}-bound; HBM floor "
                                  f"{srv.hbm_lower_bound_s * 1e3:.2f} ms; {srv.micro_batches} micro-batch(es) per replica)"),
        ("  compute / HBM / tp all-reduce / pp hand-off", f"{srv.decode_compute_s * 1e3:.2f} / {srv.decode_hbm_s * 1e3:.2f} / "
                                                       f"{srv.decode_tp_comm_s * 1e3:.2f} / {srv.decode_pp_handoff_s * 1e3:.2f} ms"),
        *([("  tp: heads axis / model-dimension axis", f"{(srv.decode_tp_comm_s - srv.decode_tp_embed_comm_s) * 1e3:.2f} / "
                                                      f"{srv.decode_tp_embed_comm_s * 1e3:.2f} ms   (2D weight-stationary: "
                                                      f"heads over {lay.tp // lay.tp_embed}, model dimension over "
                                                      f"{lay.tp_embed})")]
          if lay.tp_embed > 1 else []),
        *([("  host dispatch per step", f"{srv.host_ops:,} operators × {srv.host_s_per_op * 1e6:.0f} µs = "
                                          f"{srv.host_step_s * 1e3:.2f} ms ({train.workload.serving.serving_stack}: "
                                          "each operator dispatched from Python; a step takes at least this)")]
          if srv.host_ops else []),
        *([("  side kernels", f"{srv.side_kernels_per_layer} a layer × {p.model.num_layers} layers, "
                               f"{srv.side_kernel_floor_s * 1e6:.0f} µs launch floor each, with their bytes: "
                               f"{srv.decode_side_kernels_s * 1e3:.2f} ms ({train.workload.serving.serving_stack}: norms, "
                               "rotary, cache write, activation)")]
          if srv.side_kernels_per_layer and decode else []),
        *([("  unfused operators", f"{srv.decode_unfused_operators_s * 1e3:.2f} ms of HBM traffic "
                                    f"({train.workload.serving.serving_stack}: each small operator reads and writes HBM: "
                                    "norms' fp32 steps, rotary, copies, adds, activation)")]
          if srv.decode_unfused_operators_s and decode else []),
        ("time to first token", f"{est.time_to_first_token_s * 1e3:.1f} ms   (prefill of {train.global_batch} × "
                                f"{train.prompt_len} tokens per replica)"),
        ("tokens/s", f"{est.tokens_per_s:,.0f} {'output' if decode else 'prompt'} tokens/s over {lay.dp} replica(s)"),
        memory_total_row(mem),
        ("  weights / KV cache / activations + temporary", f"{mem.params_bytes / _GIB:.2f} / {mem.kv_cache_bytes / _GIB:.2f} / "
                                                          f"{(mem.activations_bytes + mem.temporary_bytes) / _GIB:.2f} GiB"),
    ] + ([("why this layout", p.solver.objective)] if p.solver.objective else [])


def offload_rows(est: StepEstimate, *, reason: str | None) -> list[tuple[str, str]]:
    """With offloading: why, what it costs per step, and the host memory it takes, itemised."""
    off, host = est.breakdown.offload, est.memory.host
    why = f" because {reason}" if reason and off is None else ""  # said once, in the offload row, with both
    activations = ([("activations offloaded", f"{host.activations_bytes / _GIB:,.1f} GiB of saved tensors on the host{why}, down "
                     f"behind each forward and up behind each backward: {est.breakdown.activation_offload_s:.3f} s/step exposed")]
                   if host is not None and est.layout.offload_activations else [])
    if off is None or host is None:
        return activations
    params = est.layout.offload is Offload.PARAMS
    what, flag = ("parameter shards and optimizer", "params") if params else ("optimizer state", "optimizer")
    why = f"{what} on the host because {reason}" if reason else f"{what} on the host (--offload {flag})"
    capacity = f" of {host.capacity_bytes / _GIB:,.0f} GiB (this device's share of the node)" if host.capacity_bytes else ""
    how = ("shards go up before each gather, gradients down, behind forward and backward" if params
           else "gradients run behind backward, parameters go up after Adam")
    label, items = (("weights / moments / grads / frozen weights", (host.master_weights_bytes, host.moments_bytes,
                                                                   host.grads_bytes, host.frozen_weights_bytes)) if params else
                    ("master / moments / grads / 16-bit copy / accumulators", (host.master_weights_bytes, host.moments_bytes,
                                                                              host.grads_bytes, host.param_copy_bytes,
                                                                              host.accumulated_grads_bytes)))
    return [
        ("offload", f"{why}; costs {off.exposed_transfer_s:.3f} s/step of PCIe and {off.cpu_adam_s:.3f} s of CPU Adam"),
        ("  device↔host", f"{(off.grads_to_host_bytes + off.grads_from_host_bytes + off.params_to_device_bytes) / 1e9:,.1f} GB "
                         f"a step at {off.link_bytes_per_s / 1e9:.1f} GB/s = {off.transfer_s:.3f} s, {off.exposed_transfer_s:.3f} s "
                         f"exposed ({how})"),
        ("host memory", f"{host.total_bytes / _GIB:,.1f} GiB{capacity}"),
        (f"  {label}", " / ".join(f"{v / _GIB:.1f}" for v in items) + " GiB"),
        *activations,
    ]
