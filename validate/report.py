"""Predicted against compiled (and measured): the checks ``plan validate`` prints.

Each `Check` is one quantity: the plan's prediction, the compiled module's (or a timed
run's) value, their ratio and whether it is within tolerance. Items:

- ``memory arguments``: what the step takes as input on one device (parameters, Adam
  moments, the batch) against ``argument_size_in_bytes``.
- ``memory per device``: the simulator's total against the compiled peak (arguments +
  outputs − donated + temporaries), for the schedule the program runs where the plan is
  pipelined (1F1B's ``2S − 1`` micro-batches in flight, or GPipe's), with the CPU backend's fp32 copies of 16-bit
  activations where it compiled on the CPU (`validate.predict.predicted_memory_bytes`);
  within 15 %.
- ``flops``: matmul FLOPs of the program (`validate.predict`) against the module's dots
  times their loop trip counts, within 2 %.
- ``<collective> bytes`` per mesh axis set: `validate.predict` against `validate.hlo`.
  Where the plan uses a feature whose collectives are not predicted, the row carries the
  compiled value with ``predicted`` None and ``ok`` None (not a failure). A difference of
  under 0.01 % of the module's collective bytes passes whatever its ratio.

An intra-op plan (``--planner ilp`` and the search planners) is compiled as the program it
chose, every equation pinned (`validate.intraop_program`), and each item is predicted from that
choice (`validate.intraop_predict`). A LoRA plan's arguments, FLOPs and collectives are
predicted by `validate.predict_lora`; a prefill or decode plan's (weights and KV cache) by
`validate.predict_serving`, without the compiled peak (see there).

An offloaded plan (``layout.offload``, `costmodel.step.offload`) is lowered without its offload:
the program keeps the optimizer state on the device and runs Adam there (JAX's host memory
kinds would hold it, but not DeepSpeed's 16-bit device copy and fp32 host master), so its
device-side program is what is checked (arguments as lowered, FLOPs, collectives) and the
memory per device, the host memory and the host transfers are not (`offload_not_checked`). A plan
that offloads only its saved activations is lowered with them on the device and its memory per
device checked against the simulator's peak for that program (the same layout without the offload).
A LoRA plan over fp8 frozen weights has its memory per device unchecked on emulated (CPU)
devices (`fp8_frozen_not_checked`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, computed_field

from costmodel.errors import UnsupportedError
from costmodel.inputs.layout import Offload
from costmodel.inputs.workload import FrozenDtype
from costmodel.step.kernels import keeps_compute_copy
from planner.plan_schema import Plan
from planner.programs.xla_options import compile_options
from planner.shardings import zero_sharded_specs
from validate import intraop_predict
from validate.compile_check import CompileReport
from validate.intraop_program import intra_op_program
from validate.predict import (
    PredictedCollective,
    parameters_per_device,
    predicted_collectives,
    predicted_matmul_flops,
    predicted_memory_bytes,
    unpredicted_features,
)
from validate.predict_lora import lora_argument_bytes, lora_collectives, lora_matmul_flops, lora_memory_bytes, lora_unpredicted_features
from validate.predict_serving import serving_argument_bytes, serving_collectives, serving_matmul_flops
from validate.program_runs import param_shards

MEMORY_TOLERANCE = 0.15
FLOPS_TOLERANCE = 0.02
# Collective bytes this small a share of the module's traffic (token indices XLA moves
# between devices to gather embedding rows, a few KiB) cost nothing worth predicting.
NEGLIGIBLE_TRAFFIC_SHARE = 1e-4


class Check(BaseModel):
    """One predicted quantity against what the compiler (or a run) produced."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    item: str = Field(description="What is compared.")
    axis: str | None = Field(None, description="Mesh axes ('data+tensor'), for collectives.")
    predicted: float | None = Field(description="The plan's prediction; None where it makes none.")
    actual: float = Field(description="The compiled module's or the run's value.")
    source: str = Field("compiled", description="'compiled' or 'measured'.")
    tolerance: float = Field(description="Allowed |actual/predicted - 1|.")
    unit: str = Field("bytes", description="bytes, flops or s.")
    floor: float = Field(0.0, description="A difference at most this large (in the unit) is within tolerance whatever the ratio.")

    @computed_field(description="actual / predicted.")
    @property
    def ratio(self) -> float | None:
        if self.predicted is None:
            return None
        return self.actual / self.predicted if self.predicted else (1.0 if self.actual == 0 else float("inf"))

    @computed_field(description="Within tolerance; None when nothing was predicted.")
    @property
    def ok(self) -> bool | None:
        if self.predicted is None:
            return None
        return abs(self.actual - self.predicted) <= max(self.tolerance * self.predicted, self.floor)


def predicted_argument_bytes(plan: Plan) -> float:
    """What the step takes as input on one device: master parameters (as the plan's specs
    split them), Adam moments (also split over the data axes with ZeRO ≥ 1), the batch; where
    the step keeps a compute-dtype copy (`costmodel.step.kernels.keeps_compute_copy`), that copy
    and the master split as the moments."""
    return workload_predictions(plan).argument_bytes(plan)


def _train_argument_bytes(plan: Plan) -> float:
    lay, train = plan.layout, plan.train
    copy = keeps_compute_copy(plan.model, train, lay)  # the weights held in the compute dtype, the master split as the moments
    params = parameters_per_device(plan) * (train.compute_dtype if copy else train.param_dtype).bytes
    moment_specs = plan.param_specs
    if lay.zero_stage >= 1:  # as `validate.lowering` splits them (an expert's over the data axes its expert axes leave)
        moment_specs = zero_sharded_specs(plan.model, plan.param_specs, plan.axes_of("dp"), {a.name: a.size for a in plan.mesh},
                                          whole_layers=plan.train.optimizer_in_backward)
    moment_elements = sum(el for el, _, _ in param_shards(plan, moment_specs).values())
    moments = moment_elements * 2 * train.optimizer_dtype.bytes
    master = moment_elements * train.param_dtype.bytes if copy else 0.0
    batch = 2 * train.global_batch * train.seq_len * 4 / (lay.dp * lay.cp)  # int32 tokens and targets
    return params + master + moments + batch


def offload_not_checked(plan: Plan) -> str | None:
    """What a compile-only validation of an offloaded plan leaves unchecked; None when nothing is offloaded."""
    if plan.layout.offload is Offload.NONE and not plan.layout.offload_activations:
        return None
    if plan.layout.offload is Offload.NONE:
        return ("offload activations: lowered without it (the saved activations on the device), so memory per device is "
                "checked against the simulator's peak without the offload; host memory and the device-host copies are not")
    what = " ".join(([f"offload {plan.layout.offload.value}"] if plan.layout.offload is not Offload.NONE else [])
                    + (["offload activations"] if plan.layout.offload_activations else []))
    return (f"{what}: lowered without it (parameters, optimizer state, activations and Adam on the device), so memory per "
            "device, host memory and the device-host transfers are not checked; arguments, FLOPs and collectives are the "
            "device program's")


def fp8_frozen_not_checked(plan: Plan, *, platform: str = "cpu") -> str | None:
    """What a validation on ``platform`` leaves unchecked of a LoRA plan over fp8 frozen weights;
    None for other plans or on a GPU."""
    workload = plan.train.workload
    if platform != "cpu" or not workload.runs_backward or workload.frozen_dtype is not FrozenDtype.FP8:
        return None
    return ("frozen fp8 weights: the CPU backend converts them for its fp32 dots in ways not predicted (compiled peaks "
            "0.94-1.16x a bf16-copy estimate on gpt2, dp 2-8), so memory per device is not checked; arguments, FLOPs and "
            "collectives are")


def refuse_unlowered_weights(plan: Plan) -> None:
    """Refuse in one line (`UnsupportedError`) a plan whose weights are stored in a format the
    reference program cannot lower (NF4): checking it as int4 would check another program."""
    stored = plan.train.workload.frozen_dtype
    if stored is not None:
        stored.require_lowerable()


def refuse_optimizer_options(plan: Plan) -> None:
    """Refuse in one line (`UnsupportedError`) a plan with a fine-tuning optimizer option the reference
    program does not lower (an 8-bit optimizer state; a bf16 one or the step in backward under LoRA):
    checking it would check another program. Pure bf16 (weights, gradients and moments in bf16) is
    lowered, and checked with ZeRO 3 only: with ZeRO 0–2 the CPU backend runs the whole model's bf16
    gradient reductions in fp32 (llama3-8b on data=8: compiled 1.5–1.9× the predicted memory; every
    collective byte matches), which the memory check does not predict yet. The step in backward
    (`planner.programs.fused_step`) reduces one layer's gradients at a time, so it is checked with
    any ZeRO stage (`validate.lowering.fused_train_step` says which layouts it lowers).

    >>> from planner.api import layout_plan
    >>> from costmodel.inputs.layout import Layout
    >>> from costmodel.inputs.train_config import OptimizerState
    >>> plan = layout_plan("gpt2", Layout(dp=2, micro_batch=1), global_batch=2, seq_len=128)
    >>> refuse_optimizer_options(plan)  # the fp32 default is lowered
    >>> pure = plan.model_copy(update={"train": plan.train.with_optimizer_state(OptimizerState.BF16)})
    >>> refuse_optimizer_options(pure)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    costmodel.errors.UnsupportedError: --optimizer-state bf16 is checked with ZeRO 3 only: with ZeRO 0 the CPU backend ...
    >>> refuse_optimizer_options(plan.model_copy(update={"train": plan.train.with_optimizer_state(OptimizerState.BF16, in_backward=True)}))
    >>> int8 = plan.model_copy(update={"train": plan.train.with_optimizer_state(OptimizerState.INT8)})
    >>> refuse_optimizer_options(int8)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    costmodel.errors.UnsupportedError: --optimizer-state 8bit is not lowered by the reference program, which keeps fp32 or bf16 ...
    """
    train = plan.train
    full = train.workload.trains_base_weights
    if train.optimizer_state == "bf16" and full and plan.layout.zero_stage < 3 and not train.optimizer_in_backward:
        raise UnsupportedError(f"--optimizer-state bf16 is checked with ZeRO 3 only: with ZeRO {plan.layout.zero_stage} the CPU "
                               "backend reduces the bf16 gradients in fp32, a peak the memory check does not predict yet",
                               fix="validate the plan planned with --zero 3, or with --optimizer-state fp32")
    lowered = ("fp32", "bf16") if full else ("fp32",)
    options = [f"--optimizer-state {train.optimizer_state.value}"] if train.optimizer_state not in lowered else []
    options += ["--optimizer-in-backward"] if train.optimizer_in_backward and not full else []
    if options:
        raise UnsupportedError(f"{' and '.join(options)} {'is' if len(options) == 1 else 'are'} not lowered by the reference "
                               "program, which keeps fp32 or bf16 Adam moments (and steps after the backward under LoRA)",
                               fix="plan and simulate it; validate the plan planned with --optimizer-state fp32 and no "
                                   "--optimizer-in-backward")


def refuse_unlowered_attention(plan: Plan) -> None:
    """Refuse in one line (`UnsupportedError`) a plan whose attention the reference program does not
    lower: a sliding window shorter than its sequences, or packed documents masked apart
    (``--document-len``). The program attends the whole causal sequence, so checking it would check
    another program (a window as long as the sequence changes nothing and is checked).

    >>> from planner.api import layout_plan
    >>> from costmodel.inputs.layout import Layout
    >>> from planner.config import load_model
    >>> mistral = load_model("llama3-8b").model_copy(update={"sliding_window": 1024})
    >>> refuse_unlowered_attention(layout_plan(mistral, Layout(dp=8, micro_batch=1), global_batch=8, seq_len=4096))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    costmodel.errors.UnsupportedError: sliding-window attention (1024 of 4096 tokens) is not lowered by the reference program...
    >>> packed = layout_plan("llama3-8b", Layout(dp=8, micro_batch=1), global_batch=8, seq_len=4096, document_len=512)
    >>> refuse_unlowered_attention(packed)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    costmodel.errors.UnsupportedError: attention masked to packed documents of 512 tokens is not lowered by the reference program...
    """
    if plan.train.document_len is not None:
        raise UnsupportedError(f"attention masked to packed documents of {plan.train.document_len} tokens is not lowered by the "
                               "reference program, which attends the whole causal sequence",
                               fix="plan and simulate it; validate the plan planned without --document-len")
    window = plan.model.sliding_window
    if window is not None and plan.train.seq_len > window:
        raise UnsupportedError(f"sliding-window attention ({window} of {plan.train.seq_len} tokens) is not lowered by the reference "
                               "program, which attends the whole causal sequence", fix=f"validate at --seq-len {window} or less")


def features_not_predicted(plan: Plan) -> list[str]:
    """Features of ``plan`` whose collectives are not predicted (`validate.predict`, or
    `validate.predict_lora` for LoRA); none for an intra-op plan, predicted from its choice."""
    if intra_op_program(plan) is not None:
        return []
    return workload_predictions(plan).unpredicted_features(plan)


def _collective_checks(report: CompileReport, predicted: list[PredictedCollective] | None, tolerance: float,
                       unpredicted_axes: frozenset[str] = frozenset()) -> list[Check]:
    """One row per collective kind and set of mesh axes (the batch's split names the expert axes
    first, XLA's groups name axes in mesh order); ``predicted`` None where the plan's collectives are not predicted,
    and on a row naming any of ``unpredicted_axes``."""
    actual: dict[tuple[str, tuple[str, ...]], float] = defaultdict(float)
    for c in report.collectives:
        if c.axes:
            actual[(c.kind, tuple(sorted(c.axes)))] += c.total_bytes
    totals: dict[tuple[str, tuple[str, ...]], float] = defaultdict(float)
    for p in predicted or []:
        totals[(p.kind, tuple(sorted(p.axes)))] += p.total_bytes
    floor = NEGLIGIBLE_TRAFFIC_SHARE * sum(actual.values())
    return [Check(item=f"{kind} bytes", axis="+".join(axes), actual=actual.get((kind, axes), 0.0),
                  predicted=None if predicted is None or unpredicted_axes & set(axes) else totals.get((kind, axes), 0.0),
                  tolerance=tolerance, floor=floor)
            for kind, axes in sorted(set(actual) | set(totals))]


def checks(plan: Plan, report: CompileReport, *, tolerance: float = 0.05) -> list[Check]:
    """Every comparison a compile-only validation makes (see the module docstring)."""
    program = intra_op_program(plan)
    if program is not None:  # predicted from the choice it lowers (`validate.intraop_predict`)
        return _rows(report, tolerance, argument_bytes=intraop_predict.predicted_argument_bytes(program),
                     memory_bytes=intraop_predict.predicted_memory_bytes(program, platform=report.platform),
                     matmul_flops=intraop_predict.predicted_matmul_flops(program),
                     collectives=intraop_predict.predicted_collectives(program, tuple(a.name for a in plan.mesh),
                                                                        platform=report.platform))
    predictions = workload_predictions(plan)
    unpredicted = bool(features_not_predicted(plan))
    # The peak compiled is of the program without offload; without saved activations on the host it is predicted (`predict`).
    offloaded = plan.layout.offload is not Offload.NONE
    unchecked_peak = offloaded or fp8_frozen_not_checked(plan, platform=report.platform) is not None
    memory = None if unchecked_peak or predictions.memory_bytes is None else predictions.memory_bytes(plan, platform=report.platform)
    # Where the program is compiled with XLA's collective matmul, the tensor axes' gathers and reduce-scatters
    # become loops of collective-permutes (`planner.programs.xla_options`), whose bytes are not predicted.
    windowed = frozenset(plan.axes_of("tp")) if compile_options(plan.layout, report.platform) else frozenset()
    return _rows(report, tolerance, argument_bytes=predicted_argument_bytes(plan), memory_bytes=memory,
                 matmul_flops=predictions.matmul_flops(plan),
                 collectives=None if unpredicted else predictions.collectives(plan, platform=report.platform), unpredicted_axes=windowed)


@dataclass(frozen=True)
class WorkloadPredictions:
    """What `validate` predicts of one workload's compiled program (`validate.predict`, `validate.predict_lora`,
    `validate.predict_serving`): its arguments, peak memory (None: no memory row), matmul FLOPs and collectives,
    and the features whose collectives it does not predict."""

    argument_bytes: Callable[[Plan], float]
    memory_bytes: Callable[..., float] | None
    matmul_flops: Callable[[Plan], float]
    collectives: Callable[..., list[PredictedCollective]]
    unpredicted_features: Callable[[Plan], list[str]]


def _serving_collectives(plan: Plan, *, platform: str) -> list[PredictedCollective]:
    return serving_collectives(plan)


_TRAINING = WorkloadPredictions(argument_bytes=_train_argument_bytes, memory_bytes=predicted_memory_bytes,
                                matmul_flops=predicted_matmul_flops, collectives=predicted_collectives,
                                unpredicted_features=unpredicted_features)
# Each workload's predictions, by its --workload name (`costmodel.workloads`). Serving has no memory row: the CPU
# backend's fp32 weight copies say nothing of a GPU's peak; every serving program lowered is predicted.
WORKLOAD_PREDICTIONS = {
    "pretrain": _TRAINING,
    "finetune-full": _TRAINING,
    "finetune-lora": WorkloadPredictions(argument_bytes=lora_argument_bytes, memory_bytes=lora_memory_bytes,
                                         matmul_flops=lora_matmul_flops, collectives=lora_collectives,
                                         unpredicted_features=lora_unpredicted_features),
    "prefill": WorkloadPredictions(argument_bytes=serving_argument_bytes, memory_bytes=None, matmul_flops=serving_matmul_flops,
                                   collectives=_serving_collectives, unpredicted_features=lambda plan: []),
}
WORKLOAD_PREDICTIONS["decode"] = WORKLOAD_PREDICTIONS["prefill"]


def workload_predictions(plan: Plan) -> WorkloadPredictions:
    """The predictions of ``plan``'s workload (`WORKLOAD_PREDICTIONS`)."""
    return WORKLOAD_PREDICTIONS[plan.train.workload.kind]


def _rows(report: CompileReport, tolerance: float, *, argument_bytes: float, memory_bytes: float | None, matmul_flops: float | None,
          collectives: list[PredictedCollective] | None, unpredicted_axes: frozenset[str] = frozenset()) -> list[Check]:
    """The items in order: memory arguments, memory per device (unless ``memory_bytes`` is None), FLOPs, collectives."""
    rows = [Check(item="memory arguments", predicted=argument_bytes, actual=report.argument_bytes, tolerance=tolerance)]
    if memory_bytes is not None:
        rows.append(Check(item="memory per device", predicted=memory_bytes, actual=report.peak_bytes,
                          tolerance=max(tolerance, MEMORY_TOLERANCE)))
    rows.append(Check(item="flops", predicted=matmul_flops, actual=report.matmul_flops, tolerance=FLOPS_TOLERANCE, unit="flops"))
    return rows + _collective_checks(report, collectives, tolerance, unpredicted_axes)
