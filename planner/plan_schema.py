"""`Plan`: the chosen layout as frozen data — mesh, shardings, prediction, alternatives.

A plan names the parallelism and links of every mesh axis, gives each parameter a
sharding (mesh axis per dimension, by path), predicts step time and memory with the
simulator's breakdown, and lists the runner-up layouts with why they lost. It
round-trips through JSON and holds no wall times: the same inputs give the same bytes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.estimate import StepEstimate
from planner.batch import BatchChoice
from planner.mesh_assign import carrying
from search.pins import LayoutPins

AxisSpec = tuple[str | tuple[str, ...] | None, ...]


def _without(data: Any, field: str) -> Any:
    """``data`` less ``field``: plans written before wall times left the JSON still load."""
    return {k: v for k, v in data.items() if k != field} if isinstance(data, dict) else data


class MeshAxis(BaseModel):
    """One device-mesh axis and what rides it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Axis name as given (or axis0, axis1, ... for '8x4').")
    size: int = Field(description="Devices along the axis.")
    parallelism: str = Field(description="dp, tp, pp, cp or ep (expert parallel: splits the experts, and the batch as data "
                             "parallelism does); tpe, the tensor axes splitting the model dimension of a 2D weight-stationary "
                             "decode layout (`Layout.tp_embed`).")
    links: tuple[str, ...] = Field(description="Link tiers its groups cross, e.g. ('nvlink4',).")
    nodes_spanned: int = Field(description="Nodes (TPU slices) one group along this axis spans.")


class Alternative(BaseModel):
    """A layout that was costed and lost."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    layout: Layout = Field(description="The layout.")
    step_time_s: float = Field(description="Its predicted step time.")
    memory_bytes: float = Field(description="Its per-device memory.")
    why: str = Field(description="Why it lost to the chosen plan.")


class IntraOpInfo(BaseModel):
    """What the intra-op planner (the ILP or a search planner) did for a plan."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    planner: str = Field("ilp", description="ilp, anneal, beam or random.")
    axes: tuple[str, ...] = Field(description="Mesh axes it sharded over.")
    status: str = Field(description="OPTIMAL (proven by the ILP) or FEASIBLE (best found; a search proves nothing).")
    objective_s: float = Field(description="Predicted seconds of one stage's micro-batch step under its shardings.")
    gap: float | None = Field(description="Relative optimality gap (0 when OPTIMAL; None for a search planner).")
    memory_bytes: float = Field(description="Per-device memory of the chosen shardings (reference program).")
    ops: int = Field(description="Nodes of the stage's training-step graph.")
    free_nodes: int = Field(description="Decisions left after merging followers.")
    variables: int = Field(0, description="Boolean variables of the ILP.")
    evaluations: int = Field(0, description="Candidates a search planner evaluated.")
    choice: dict[str, str] | None = Field(None, description="Free graph node → the name of its chosen strategy: what "
                                          "`plan validate` lowers (`validate.intraop_program`).")

    @model_validator(mode="before")
    @classmethod
    def _drop_solve_time(cls, data: Any) -> Any:
        return _without(data, "solve_time_s")


class SolverInfo(BaseModel):
    """How the layout was found."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    planner: str = Field(description="Which planner chose the layout.")
    status: str = Field(description="OPTIMAL when every layout was costed and the intra-op planner (if any) proved its "
                                    "choice; FEASIBLE when a time limit (or a search planner) left that unproven.")
    evaluated: int = Field(description="Candidates costed by the simulator.")
    pruned: dict[str, int] = Field(description="Candidates dropped before simulation, by rule.")
    intra_op: IntraOpInfo | None = Field(None, description="The intra-op ILP's report, when it chose the parameter shardings.")
    offload_reason: str | None = Field(None, description="Why the layout offloads to the host (its saved activations, optimizer "
                                       "state or parameters), when the "
                                       "planner chose to (nothing fit without); None otherwise.")
    loss_pieces_reason: str | None = Field(None, description="Why the layout runs the loss in pieces "
                                           "(``SoftwareStack.cross_entropy_chunks``), when the planner chose to (nothing fit "
                                           "with it whole); None otherwise.")
    objective: str | None = Field(None, description="What a serving search ranked the layouts by, and the rule that chose it "
                                  "(latency at a batch too small to be compute-bound, tokens/s otherwise); None for training.")
    pins: LayoutPins | None = Field(None, description="The layout parts fixed by hand (plan --zero, --micro-batch, --tp, ...; "
                                    "the search chose the rest); None when nothing was pinned.")


class Plan(BaseModel):
    """A parallel training layout and its predicted cost."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelConfig = Field(description="The model planned.")
    train: TrainConfig = Field(description="Sequence length, batch and precision.")
    hardware: str = Field(description="Hardware profile.")
    mesh: tuple[MeshAxis, ...] = Field(description="Device mesh, major axis first.")
    layout: Layout = Field(description="Parallel degrees and knobs.")
    param_specs: dict[str, AxisSpec] = Field(description="Parameter path → mesh axis (or None) per dimension.")
    activation_specs: dict[str, AxisSpec] = Field(description="Key activations → mesh axis per dimension.")
    predicted: StepEstimate = Field(description="Simulated step time, throughput and memory.")
    alternatives: tuple[Alternative, ...] = Field(description="Runner-up layouts, fastest first.")
    solver: SolverInfo = Field(description="How the layout was found.")
    model_notes: tuple[str, ...] = Field((), description="What the plan assumes of the model's limits: positions served by "
                                         "rope_scaling, sliding-window attention (which plan validate does not lower).")
    batch: BatchChoice | None = Field(None, description="The training batch and why: the rule's choice (planner.batch) or the "
                                      "given one, with a warning when it starves the devices; None for serving plans.")

    @model_validator(mode="before")
    @classmethod
    def _drop_plan_time(cls, data: Any) -> Any:
        # ``workload`` is written from ``train`` (a computed field), so it is dropped on reading.
        return _without(_without(data, "plan_time_s"), "workload")

    @computed_field(description="What the step does: pretrain, finetune-full, finetune-lora, prefill or decode "
                                "(train.workload has its settings).")
    @property
    def workload(self) -> str:
        return self.train.workload.kind

    def axes_of(self, parallelism: str) -> tuple[str, ...]:
        """Names of the mesh axes carrying ``parallelism`` (dp, tp, pp, cp or ep); the data axes
        include the expert axes, first (`planner.mesh_assign.carrying`)."""
        return tuple(a.name for kind in carrying(parallelism) for a in self.mesh if a.parallelism == kind and a.size > 1)
