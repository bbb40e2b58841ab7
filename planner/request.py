"""`PlanRequest`: everything `planner.api.plan` is asked, in one typed value.

The model, the cluster and its mesh, the training or serving workload, the software stack and
precision, which planner searches and how long it may. The CLI, the library call and the
benchmarks each build one; ``plan(request)`` answers it.

>>> r = PlanRequest(model="llama3-8b", mesh="8x4", planner="ilp")
>>> r.planner, r.planner.shards_intra_op, r.hardware, r.global_batch
(<PlannerName.ILP: 'ilp'>, True, 'h100-sxm', None)
>>> PlanRequest(model="gpt2", mesh="8", planner="greedy")
Traceback (most recent call last):
costmodel.errors.InvalidConfigError: unknown planner 'greedy'; fix: use one of grid, ilp, anneal, beam, random
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from costmodel.errors import InvalidConfigError, UnsupportedError, flag_error
from costmodel.inputs.layout import Offload
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import Attention, SoftwareStack
from costmodel.inputs.train_config import OptimizerState, Precision
from costmodel.inputs.workload import InferenceConfig, LoraConfig, WorkloadKind
from costmodel.record import Record
from costmodel.step.run_overheads import RunSettings
from search.pins import INTRA_OP_PINS, LayoutPins, flag_of, pin_flag


class PlannerName(StrEnum):
    """Which planner chooses the shardings (``--planner``)."""

    GRID = "grid"  # the layout search with Megatron sharding rules
    ILP = "ilp"  # the same search, then the CP-SAT intra-op ILP shards each stage
    ANNEAL = "anneal"  # search planners on the ILP's strategy space
    BEAM = "beam"
    RANDOM = "random"

    @property
    def shards_intra_op(self) -> bool:
        """Whether an intra-op planner replaces the rule-based shardings (every planner but grid)."""
        return self is not PlannerName.GRID


class PlanRequest(Record):
    """What to plan, on what, for which workload, and with which planner and limits."""

    # The model and the cluster.
    model: str | Path | ModelConfig = Field(description="Preset name, config.json path, or a ModelConfig.")
    hardware: str = Field("h100-sxm", description="Hardware profile name or JSON path.")
    devices_per_node: int | None = Field(None, description="Override of the profile's devices per node.")
    memory_reserve_gib: float | None = Field(None, ge=0, description="Device memory the runtime takes beside the plan's arrays "
                                             "(CUDA context, NCCL buffers, fragmentation), GiB: plans fit within usable "
                                             "memory less this; None: the part's default (costmodel.hardware.reserve).")
    mesh: str | None = Field(None, description="Device mesh, e.g. '8x4' or 'data=8,tensor=4'; or give `devices`.")
    devices: int | None = Field(None, description="Device count; the planner shapes the mesh (exactly one of this and `mesh`).")
    # The workload (`planner.config.train_config` checks the sizes).
    seq_len: int | None = Field(None, description="Tokens per sequence (serving: the context); default "
                                                  "`planner.config.default_seq_len` of the model.")
    global_batch: int | None = Field(None, description="Sequences per step; None: the planner chooses it (`planner.batch`). "
                                                       "Serving: sequences per replica, default 1.")
    workload: WorkloadKind = Field(WorkloadKind.PRETRAIN, description="pretrain, finetune-full, finetune-lora, prefill or decode.")
    lora: LoraConfig | None = Field(None, description="finetune-lora's rank, targets and frozen storage; default LoraConfig().")
    inference: InferenceConfig | None = Field(None, description="prefill's and decode's prompt, KV cache, latency bound and "
                                                                "weight storage; default InferenceConfig().")
    document_len: int | None = Field(None, description="Sequence packing: documents of this many tokens in each sequence, "
                                                       "attention masked to each (`TrainConfig.document_len`); None: one a sequence.")
    tokens: float | None = Field(None, description="Training tokens: the prediction then says how long training takes.")
    run: RunSettings | None = Field(None, description="Checkpoint interval and loader the time to train assumes; "
                                                      "default RunSettings().")
    # How the step runs.
    stack: str | SoftwareStack = Field("jax", description="Software stack (a `costmodel.inputs.stack.STACKS` name) whose "
                                                          "step time the layout is chosen for.")
    attention: Attention | None = Field(None, description="Attention kernel the layout is chosen for; default the stack's for "
                                                          "grid, materialized for the intra-op planners (the reference program's).")
    precision: Precision = Field(Precision.BF16, description="fp32, tf32, bf16, fp16 or fp8.")
    optimizer_state: OptimizerState = Field(OptimizerState.FP32, description="How the optimizer state is stored: fp32 (master "
                                            "copy and moments), bf16 (pure bf16, torchtune's default) or 8bit (8-bit AdamW).")
    optimizer_in_backward: bool = Field(False, description="The optimizer step fused into the backward pass (torchtune's "
                                        "optimizer_in_bwd): no gradient buffer, one micro-batch per step.")
    offload: Offload | None = Field(None, description="none, optimizer (ZeRO-Offload), params (FSDP's CPU offload, ZeRO 3), or "
                                    "None: only when nothing fits without.")
    offload_activations: bool = Field(False, description="Saved activations to host memory and back (torchtune's activation "
                                      "offloading; grid planner, no pipeline stages).")
    pins: LayoutPins = Field(LayoutPins(), description="Parts of the layout fixed by hand (--zero, --micro-batch, --tp, ...); "
                                                       "the planner chooses the rest (`search.pins`).")
    # The planner and its limits.
    planner: PlannerName = Field(PlannerName.GRID, description="grid, ilp, anneal, beam or random.")
    time_limit_s: float = Field(20.0, description="Limit of the layout search and, separately, of the intra-op planner; "
                                                  "the best found is kept (solver.status FEASIBLE).")
    seed: int = Field(0, description="Random seed of a search planner.")

    # The checks below raise the error catalog's errors themselves (pydantic passes them through),
    # so a bad name or limit gets the same one line from the library as from the CLI.
    @field_validator("planner", mode="before")
    @classmethod
    def _known_planner(cls, planner: Any) -> Any:
        if planner not in set(PlannerName):
            raise InvalidConfigError(f"unknown planner {planner!r}", fix=f"use one of {', '.join(PlannerName)}")
        return planner

    @field_validator("devices")
    @classmethod
    def _positive_devices(cls, devices: int | None) -> int | None:
        if devices is not None and devices < 1:
            raise InvalidConfigError(f"--devices={devices} is not a positive device count", fix="give at least 1 device")
        return devices

    @field_validator("time_limit_s")
    @classmethod
    def _positive_time_limit(cls, time_limit_s: float) -> float:
        if not time_limit_s > 0:  # also catches NaN
            raise InvalidConfigError(f"--time-limit-s={time_limit_s} is not a positive number of seconds", fix="e.g. --time-limit-s 20")
        return time_limit_s

    @field_validator("offload", mode="before")
    @classmethod
    def _known_offload(cls, offload: Any) -> Any:
        if offload is not None and offload not in set(Offload):
            raise InvalidConfigError(f"unknown offload {offload!r}", fix=f"use one of: {', '.join(o.value for o in Offload)}")
        return offload

    @model_validator(mode="after")
    def _offload_planned(self) -> PlanRequest:
        if (self.offload not in (None, Offload.NONE) or self.offload_activations) and self.planner.shards_intra_op:
            raise UnsupportedError(f"--planner {self.planner} does not plan offloaded layouts",
                                   fix="use --planner grid, or --offload none without --offload-activations")
        return self

    @model_validator(mode="after")
    def _optimizer_options_planned(self) -> PlanRequest:
        options = ([f"--optimizer-state {self.optimizer_state.value}"] if self.optimizer_state is not OptimizerState.FP32 else []) + \
            (["--optimizer-in-backward"] if self.optimizer_in_backward else [])
        options += [f"--document-len {self.document_len}"] if self.document_len is not None else []
        if options and self.planner.shards_intra_op:
            raise UnsupportedError(f"--planner {self.planner} shards the traced reference program, which keeps fp32 master weights "
                                   f"and moments, steps after the backward and attends whole sequences, not {' '.join(options)}",
                                   fix=f"use --planner grid, which costs {' '.join(options)}")
        return self

    @model_validator(mode="after")
    def _loss_pieces_planned(self) -> PlanRequest:
        if isinstance(self.stack, SoftwareStack) and self.stack.cross_entropy_chunks > 1 and self.planner.shards_intra_op:
            raise UnsupportedError(f"--planner {self.planner} shards the traced reference program, whose loss runs whole, not in "
                                   f"{self.stack.cross_entropy_chunks} pieces", fix="use --planner grid, or --cross-entropy-chunks 1")
        return self

    @model_validator(mode="after")
    def _pins_planned(self) -> PlanRequest:
        unhonoured = self.pins.unhonoured_by_intra_op()
        if unhonoured and self.planner.shards_intra_op:
            flags = " ".join(pin_flag(name, value) for name, value in unhonoured.items())
            honoured = " and ".join(flag_of(name) for name in INTRA_OP_PINS)
            raise UnsupportedError(f"--planner {self.planner} cannot honour {flags}: it shards each op over the mesh axes itself, "
                                   f"with no degree, ZeRO stage, sequence parallelism or pipeline stage to pin (it honours {honoured})",
                                   fix=f"use --planner grid, which honours {flags}, or drop {flags}")
        return self


def plan_request(**fields: Any) -> PlanRequest:
    """A `PlanRequest` from keyword values; a malformed value is reported by its flag (``--global-batch='x': ...``).

    >>> plan_request(model="gpt2", mesh="8", global_batch="many")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    costmodel.errors.InvalidConfigError: --global-batch='many': Input should be a valid integer, ...; fix: give a valid --global-batch
    """
    try:
        return PlanRequest(**fields)
    except ValidationError as err:
        raise flag_error(err) from None
