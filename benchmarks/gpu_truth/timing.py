"""Cases, their timing, and the run that measures them within a time budget.

A `Case` predicts its seconds with the cost model and measures them on the device; `run_cases`
runs them in order until the budget nears, and records every case as a `Row`: measured,
predicted, or why not (the error's text, or "skipped": the budget ran out). One case failing
never stops the run.

`median_call_s` times a jitted call as the micro-benchmarks need it: compiled and warmed up,
then ``repeats`` repeats of ``calls`` calls enqueued back to back and waited for once
(``block_until_ready``), so JAX's dispatch overlaps the device's work; a repeat's time over
its calls, median over repeats.

>>> rows = run_cases([Case(kind="hbm", name="n", shape="1", dtype="f", predict=lambda: 2.0, measure=lambda: 1.0)], budget_s=60)
>>> rows[0].ratio
0.5
"""

from __future__ import annotations

import math
import statistics
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

KINDS = ("gemm", "attention", "hbm", "elementwise", "step", "decode", "prefill")
_ERROR_CHARS = 300
# A repeat's calls fill about this many seconds, so a microsecond kernel is not all dispatch.
_REPEAT_TARGET_S = 0.05
_MAX_CALLS = 200


@dataclass(frozen=True)
class Case:
    """One measurement: what it is, and how to predict and measure its seconds."""

    kind: str
    name: str
    shape: str
    dtype: str
    predict: Callable[[], float]
    measure: Callable[[], float]
    group: str = ""  # cases compared with each other (a model's step layouts)
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class Row(BaseModel):
    """One case's outcome, as the CSV holds it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str = Field(description="gemm, attention, hbm, elementwise, step, decode or prefill.")
    case: str = Field(description="What ran, e.g. 'llama3-8b mlp_in tp2'.")
    shape: str = Field(description="Its sizes, e.g. 'm8192 n7168 k4096'.")
    dtype: str = Field(description="Compute dtype.")
    predicted_s: float | None = Field(description="The cost model's seconds; None where it failed.")
    measured_s: float | None = Field(description="Median measured seconds; None where the run failed or was skipped.")
    group: str = Field("", description="Cases ranked together (one model's training layouts).")
    note: str = Field("", description="What the case stands for (the planner's choice, an alternative).")
    error: str = Field("", description="Why a value is missing: the error's text, or 'skipped: ...'.")

    @property
    def ratio(self) -> float | None:
        """measured / predicted, where both exist."""
        if self.predicted_s is None or self.measured_s is None or self.predicted_s <= 0:
            return None
        return self.measured_s / self.predicted_s


def error_text(err: BaseException) -> str:
    """One line naming the error: its type and the first line of its message, cut short."""
    message = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {message}"[:_ERROR_CHARS]


def _attempt(fn: Callable[[], float]) -> tuple[float | None, str]:
    try:
        value = float(fn())
    except Exception as err:  # a case's failure (cuDNN refusing a shape, out of memory) is its row, not the run's end
        traceback.print_exc(limit=3)
        return None, error_text(err)
    if not math.isfinite(value):
        return None, f"not finite: {value}"
    return value, ""


def run_cases(cases: list[Case], *, budget_s: float, on_row: Callable[[Row], None] | None = None) -> list[Row]:
    """Predict and measure ``cases`` in order; once ``budget_s`` seconds have passed, the rest
    are recorded as skipped (with their prediction)."""
    start, rows = time.perf_counter(), []
    for case in cases:
        predicted, predict_error = _attempt(case.predict)
        if time.perf_counter() - start > budget_s:
            measured, measure_error = None, f"skipped: the {budget_s:.0f} s time budget ran out"
        else:
            measured, measure_error = _attempt(case.measure)
        row = Row(kind=case.kind, case=case.name, shape=case.shape, dtype=case.dtype, predicted_s=predicted, measured_s=measured,
                  group=case.group, note=case.note, error="; ".join(e for e in (predict_error, measure_error) if e))
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


def median_call_s(fn: Callable[..., Any], *args: Any, repeats: int = 5, warmup: int = 1) -> float:
    """Median seconds of one call of the jitted ``fn(*args)`` (module docstring)."""
    return median_chained_s(lambda _: fn(*args), None, repeats=repeats, warmup=warmup)


def median_chained_s(advance: Callable[[Any], Any], state: Any, *, repeats: int = 5, warmup: int = 1) -> float:
    """Median seconds of one ``state = advance(state)``: a step whose outputs are the next
    step's inputs (a training step's donated parameters, a decode step's KV cache), timed as
    `median_call_s` times a call. Each state is dropped once the next is enqueued, so only
    two are alive at a time."""
    import jax  # why: the case builders import this module before JAX is needed

    for _ in range(1 + warmup):  # the first call compiles
        state = jax.block_until_ready(advance(state))
    start = time.perf_counter()
    state = jax.block_until_ready(advance(state))
    once_s = time.perf_counter() - start
    calls = max(1, min(_MAX_CALLS, int(_REPEAT_TARGET_S / max(once_s, 1e-9))))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            state = advance(state)
        state = jax.block_until_ready(state)
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)
