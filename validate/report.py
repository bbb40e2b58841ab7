"""Predicted against compiled: the checks ``plan validate --compile-only`` prints.

Today: the bytes the step takes as input (parameters, optimizer state, batch) against
``memory_analysis().argument_size_in_bytes``. Collective bytes, FLOPs with trip counts
and timed runs are the validator issue's next steps.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from costmodel.data_parallel import stage_params_per_device
from planner.schema import Plan
from validate.compile_check import CompileReport


class Check(BaseModel):
    """One predicted quantity against what the compiler produced."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    item: str = Field(description="What is compared.")
    predicted: float = Field(description="The plan's prediction.")
    actual: float = Field(description="The compiled module's value.")
    source: str = Field("compiled", description="Where the actual value comes from.")
    tolerance: float = Field(description="Allowed |actual/predicted - 1|.")

    @property
    def ratio(self) -> float:
        return self.actual / self.predicted if self.predicted else float("inf")

    @property
    def ok(self) -> bool:
        return abs(self.ratio - 1) <= self.tolerance


def predicted_argument_bytes(plan: Plan) -> float:
    """What the step takes as input on one device: master parameters, Adam moments, the batch."""
    lay, train = plan.layout, plan.train
    n = stage_params_per_device(plan.model, lay)
    params = n * train.param_dtype.bytes / (lay.dp if lay.zero_stage >= 3 else 1)
    moments = n * 2 * train.optimizer_dtype.bytes / (lay.dp if lay.zero_stage >= 1 else 1)
    batch = 2 * train.global_batch * train.seq_len * 4 / lay.dp  # int32 tokens and targets
    return params + moments + batch


def checks(plan: Plan, report: CompileReport, *, tolerance: float = 0.05) -> list[Check]:
    """The comparisons a compile-only validation can make today."""
    return [
        Check(item="memory arguments", predicted=predicted_argument_bytes(plan), actual=report.argument_bytes, tolerance=tolerance),
    ]
