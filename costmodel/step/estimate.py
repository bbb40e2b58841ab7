"""`StepEstimate`: the simulator's answer, with every number explained.

>>> t = TimeBreakdown(compute_s=1.0, memory_bound_s=0.2, recompute_s=0.3, bubble_s=0.1,
...                   exposed_comm_s=0.05, optimizer_s=0.02, comm_s_by_axis={"tp": 0.4})
>>> round(t.total_s, 6)
1.67
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, computed_field

from costmodel.inputs.layout import Layout
from costmodel.record import Record
from costmodel.step.memory import MemoryBreakdown
from costmodel.step.offload import OffloadTimes
from costmodel.step.run_overheads import RunOverheads
from costmodel.step.schedules import TimelineEvent


class TimeBreakdown(Record):
    """Where the busiest device's step time goes; the additive parts sum to the step time.

    ``comm_s_by_axis`` is the total time of each parallel dimension's collectives,
    overlapped or not; ``exposed_comm_s`` is the part on the critical path (tensor and
    expert parallel in full, context parallel and data parallel beyond what overlaps).
    """

    compute_s: NonNegativeFloat = Field(description="Matmul and attention kernels (forward + backward), first pass.")
    memory_bound_s: NonNegativeFloat = Field(
        description="HBM-bound kernels (norms, activations, softmax, residuals, loss, FSDP2 parameter copy-outs, "
        "gradient accumulation).")
    recompute_s: NonNegativeFloat = Field(description="Forward work repeated in backward by activation recompute.")
    bubble_s: NonNegativeFloat = Field(description="Pipeline idle time of the busiest stage.")
    exposed_comm_s: NonNegativeFloat = Field(description="Communication not hidden behind compute.")
    optimizer_s: NonNegativeFloat = Field(description="Optimizer update (HBM-bound).")
    first_touch_s: NonNegativeFloat = Field(0.0, description="Faulting in temporaries the runtime maps afresh each step (CPU only).")
    offload_transfer_s: NonNegativeFloat = Field(0.0, description="Offloading: device↔host copies on the critical path (gradients "
                                                 "beyond the backward they hide behind, the updated parameters up).")
    cpu_optimizer_s: NonNegativeFloat = Field(0.0, description="Offloading: the Adam step on the host CPU (DeepSpeed CPU Adam).")
    activation_offload_s: NonNegativeFloat = Field(0.0, description="Activation offload: saved tensors' copies down and up beyond "
                                                   "the forward and backward they run beside (`costmodel.step.offload`).")
    offload: OffloadTimes | None = Field(None, description="Offloading: bytes each way, link and CPU rates, total and exposed "
                                         "seconds (`costmodel.step.offload`); None when nothing is offloaded.")
    comm_s_by_axis: dict[str, NonNegativeFloat] = Field(
        default_factory=dict, description="Total collective time per parallel dimension (tp, cp, ep, pp, dp), overlapped or not."
    )

    @computed_field(description="Sum of the additive parts: the step time.")
    @property
    def total_s(self) -> float:
        return (self.compute_s + self.memory_bound_s + self.recompute_s + self.bubble_s + self.exposed_comm_s + self.optimizer_s
                + self.first_touch_s + self.offload_transfer_s + self.cpu_optimizer_s + self.activation_offload_s)


class ServingTimes(Record):
    """Where an inference step's time goes (`costmodel.step.inference`): one decode step (one token
    for every sequence) and one prefill, each per replica, pipeline stages summed."""

    decode_compute_s: NonNegativeFloat = Field(description="Decode: matmul and attention kernels at the achievable compute peak.")
    decode_hbm_s: NonNegativeFloat = Field(description="Decode: every weight byte and the whole KV cache read once, at the "
                                           "achievable HBM bandwidth.")
    decode_tp_comm_s: NonNegativeFloat = Field(description="Decode: tensor-parallel collectives, two all-reduces per layer of "
                                               "batch × hidden (1D), or those of `costmodel.step.inference.tensor_parallel_s` (2D).")
    decode_tp_embed_comm_s: NonNegativeFloat = Field(0.0, description="Decode: of decode_tp_comm_s, the collectives over the "
                                                     "axes splitting the model dimension (2D weight-stationary; 0 in 1D).")
    decode_pp_handoff_s: NonNegativeFloat = Field(description="Decode: activations passed between pipeline stages.")
    decode_bound: str = Field(description="What limits the decode kernels: 'hbm' (bandwidth) or 'compute'.")
    hbm_lower_bound_s: NonNegativeFloat = Field(description="Decode per-token floor: the busiest device's weight and KV-cache "
                                                "bytes at the datasheet HBM bandwidth, summed over the stages in series "
                                                "(at least the busiest stage times its micro-batches).")
    prefill_compute_s: NonNegativeFloat = Field(description="Prefill: forward matmuls and causal attention of the prompts.")
    prefill_comm_s: NonNegativeFloat = Field(description="Prefill: tensor-parallel all-reduces and pipeline hand-offs.")
    micro_batches: int = Field(description="Micro-batches in flight per replica (as many as stages, at most one per sequence).")
    host_ops: int = Field(0, description="Operators the serving stack dispatches one by one from the host per step "
                          "(`costmodel.inputs.serving_stack`; 0 for a compiled or graph-replayed step).")
    host_s_per_op: float = Field(0.0, description="The stack's host seconds per dispatched operator.")
    host_step_s: float = Field(0.0, description="Host seconds to dispatch one step (host_ops × host_s_per_op); a decode "
                               "step or a prefill takes the longer of this and its kernels' time.")
    side_kernels_per_layer: int = Field(0, description="Side kernels a decoder layer launches beside its GEMMs and attention "
                                        "(`costmodel.inputs.serving_stack.ServingStack.side_kernels_per_layer`; 0: not counted).")
    side_kernel_floor_s: float = Field(0.0, description="The part's launch floor each side kernel pays.")
    decode_side_kernels_s: float = Field(0.0, description="Decode: of the compute and HBM time, the side kernels' over every "
                                         "layer (their launch floors and activation bytes).")
    decode_unfused_operators_s: float = Field(0.0, description="Decode: of the HBM time, an eager stack's small operators' "
                                              "over every layer, each reading and writing HBM "
                                              "(`costmodel.step.serving_kernels.unfused_operator_kernel`; their launches "
                                              "are the host dispatch).")


class StepEstimate(BaseModel):
    """Predicted step time, throughput, utilisation and memory of one layout."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    layout: Layout = Field(description="The layout simulated.")
    hardware: str = Field(description="Hardware profile name.")
    n_devices: int = Field(description="Devices in the layout.")
    step_time_s: float = Field(description="Seconds per optimizer step.")
    tokens_per_s: float = Field(description="Tokens per second over all devices.")
    mfu: float = Field(description="Model FLOPs / (step · devices · dense peak); model FLOPs per training token 6·N + 6·L·H·Q·s "
                       "(N without the input embedding, causal attention, no recompute: costmodel.workloads.flops).")
    hfu: float = Field(description="Hardware FLOPs (model FLOPs plus recomputed forward FLOPs) / (step · devices · dense peak).")
    model_flops: float = Field(description="Model FLOPs of one step, over all devices.")
    breakdown: TimeBreakdown = Field(description="Where the step time goes.")
    memory: MemoryBreakdown = Field(description="Per-device memory, itemised.")
    fits: bool | None = Field(description="Whether the memory fits the device's HBM.")
    timeline: tuple[TimelineEvent, ...] = Field((), description="Pipeline micro-steps, when asked for.")
    time_to_train_s: float | None = Field(None, description="Seconds to train on the requested tokens: the steps plus "
                                          "input_overhead_s and checkpoint_overhead_s; None when no token count was given.")
    input_overhead_s: float | None = Field(None, description="Seconds of time_to_train_s the steps wait for the input pipeline "
                                           "(run_overheads says what it assumed); None when no token count was given.")
    checkpoint_overhead_s: float | None = Field(None, description="Seconds of time_to_train_s spent writing checkpoints "
                                                "(run_overheads says what it assumed); None when no token count was given.")
    run_overheads: RunOverheads | None = Field(None, description="The time to train itemised, with the storage rates, "
                                               "checkpoint size and interval it assumed; None when no token count was given.")
    device_hours: float | None = Field(None, description="time_to_train_s × devices / 3600; None when no token count was given.")
    time_per_output_token_s: float | None = Field(None, description="Inference: seconds between a sequence's output tokens "
                                                  "(one decode step); None for training.")
    time_to_first_token_s: float | None = Field(None, description="Inference: seconds to prefill a replica's prompts and emit "
                                                "their first tokens; None for training.")
    serving: ServingTimes | None = Field(None, description="Inference: the decode and prefill times itemised; None for training.")
