"""Where a measured training step's time goes, kernel by kernel, beside the simulator's terms.

``--profile`` traces a few steps of each step model's planner's choice with ``jax.profiler``
(its Perfetto JSON needs no other package) and sums the device's kernel time per category:

| category | kernels |
|---|---|
| `attention` | cuDNN's fused attention (``sdpa``, ``fmha``) |
| `gemm` | cuBLAS / cuBLASLt / CUTLASS / Triton GEMMs (``gemm``, ``xmma``, ``nvjet``, ``cutlass``, ``dot``) |
| `copy` | copies, transposes, memcpy and memset |
| `slice` | dynamic slices and updates, gathers and scatters (a layer loop's weight and gradient slices) |
| `reduction` | reduction fusions (norm statistics, softmax and loss sums, gradient sums) |
| `elementwise` | every other fusion (casts, activations, the optimizer update) |

Beside them: the step's measured time (else the traced kernels' span per step) not covered by
any kernel (``idle``: launch gaps, host waits), and the simulator's terms that map onto them
(`step_groups`: `compute_s` + `recompute_s` (matmuls and attention) against ``gemm`` +
``attention``, `memory_bound_s` + `optimizer_s` against the rest; `decode_groups`: a decode
step's kernels against its time per output token).
Kernels are read from the device's own timeline (a process named ``/device:...``); on the CPU,
which has none, from the executor's per-op events (the CPU check of this code path).

>>> category("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", "custom-call.7")
'gemm'
>>> category("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma", "custom-call.3")
'attention'
>>> category("loop_convert_fusion", "loop_convert_fusion.12")
'elementwise'
"""

from __future__ import annotations

import gzip
import json
import re
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable, NamedTuple

from benchmarks.gpu_truth.timing import error_text
from costmodel.step.estimate import StepEstimate

_CATEGORIES = (  # first match wins
    ("attention", re.compile(r"sdpa|fmha|flash_?att")),
    ("gemm", re.compile(r"gemm|xmma|nvjet|cutlass|cublas|matmul|\bdot|_dot")),
    ("copy", re.compile(r"copy|transpose|memcpy|memset")),
    ("slice", re.compile(r"dynamic[-_]?(update[-_]?)?slice|scatter|gather")),
    ("reduction", re.compile(r"reduce(?!-precision)|reduction")),
)
CATEGORIES = (*(name for name, _ in _CATEGORIES), "elementwise")
COLUMNS = ("model", "category", "kernels_per_step", "measured_s", "share", "predicted_s", "predicted_from", "top_kernels", "error")


def category(kernel: str, hlo_op: str) -> str:
    """The category (module docstring) of a kernel by its name and its HLO instruction's."""
    text = f"{kernel} {hlo_op}".lower()
    return next((name for name, pattern in _CATEGORIES if pattern.search(text)), "elementwise")


def kernel_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The trace's kernel executions: the device's timeline where there is one, else the host's per-op events."""
    processes = {e["pid"]: e.get("args", {}).get("name", "") for e in trace["traceEvents"]
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
    ops = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("dur", 0) > 0]
    device = [e for e in ops if processes.get(e.get("pid"), "").startswith("/device:")]
    return device or [e for e in ops if "hlo_op" in e.get("args", {})]


def summarize(events: list[dict[str, Any]], steps: int) -> dict[str, dict[str, Any]]:
    """Per category: kernels and seconds per step, and the three largest kernels' names."""
    seconds: dict[str, float] = defaultdict(float)
    counts: Counter[str] = Counter()
    by_kernel: dict[str, Counter[str]] = defaultdict(Counter)
    for e in events:
        name, hlo_op = e["name"], e.get("args", {}).get("hlo_op", "")
        where = category(name, hlo_op)
        seconds[where] += e["dur"] * 1e-6
        counts[where] += 1
        by_kernel[where][name] += e["dur"]  # the kernel's own name: under CUDA graphs hlo_op is only "command_buffer_N"
    return {c: {"kernels_per_step": counts[c] / steps, "measured_s": seconds[c] / steps,
                "top_kernels": "; ".join(k[:60] for k, _ in by_kernel[c].most_common(3))} for c in CATEGORIES}


def span_s(events: list[dict[str, Any]], steps: int) -> float:
    """Seconds per step from the first kernel's start to the last one's end (chained steps)."""
    return (max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)) * 1e-6 / steps


def read_trace(folder: Path) -> dict[str, Any]:
    """The Perfetto JSON ``jax.profiler.trace(..., create_perfetto_trace=True)`` wrote under ``folder``."""
    [path] = sorted(folder.rglob("perfetto_trace.json.gz"))[-1:]
    with gzip.open(path) as f:
        return json.load(f)


def traced_steps(advance: Callable[[Any], Any], state: Any, *, steps: int = 3) -> dict[str, Any]:
    """Run ``steps`` chained steps (after two warm-ups) under the profiler; the trace."""
    import jax  # why: JAX is imported only once a case runs

    for _ in range(2):
        state = jax.block_until_ready(advance(state))
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder, create_perfetto_trace=True):
            for _ in range(steps):
                state = advance(state)
            jax.block_until_ready(state)
        return read_trace(Path(folder))


class Predicted(NamedTuple):
    """A sum of measured categories beside the simulator's term for it."""

    name: str
    categories: tuple[str, ...]
    predicted_s: float
    source: str


def step_groups(estimate: StepEstimate) -> list[Predicted]:
    """A training step's sums (module docstring): matmuls and attention, and every other kernel."""
    b = estimate.breakdown
    return [Predicted("gemm + attention", ("gemm", "attention"), b.compute_s + b.recompute_s, "compute_s + recompute_s"),
            Predicted("other kernels", tuple(c for c in CATEGORIES if c not in ("gemm", "attention")), b.memory_bound_s + b.optimizer_s,
                      "memory_bound_s + optimizer_s")]


def decode_groups(estimate: StepEstimate) -> list[Predicted]:
    """A decode step's sum: every kernel against the time per output token (its kernels are
    split by bound, HBM or compute, not by kind)."""
    return [Predicted("every kernel", CATEGORIES, estimate.time_per_output_token_s or 0.0, "time_per_output_token_s")]


def profile_rows(model: str, measured_step_s: float | None, groups: list[Predicted], run: Callable[[], dict[str, Any]], *,
                 steps: int = 3) -> list[dict[str, Any]]:
    """The `COLUMNS` rows of one model's profile: each category, then ``idle`` and the ``groups``'
    sums beside the simulator's terms; one row holding the error if the trace fails."""
    try:
        events = kernel_events(run())
        summary = summarize(events, steps)
    except Exception as err:  # a profile that fails is this model's row, not the run's end
        return [dict.fromkeys(COLUMNS, "") | {"model": model, "error": error_text(err)}]
    step_s = measured_step_s or span_s(events, steps)
    rows = [{"model": model, "category": c, **s, "share": s["measured_s"] / step_s, "predicted_s": "", "predicted_from": "",
             "error": ""} for c, s in summary.items()]
    busy_s = sum(s["measured_s"] for s in summary.values())
    sums = [("idle", step_s - busy_s, 0.0, "")] + [
        (g.name, sum(summary[c]["measured_s"] for c in g.categories), g.predicted_s, g.source) for g in groups]
    for name, measured, predicted, source in sums:
        rows.append({"model": model, "category": name, "kernels_per_step": "", "measured_s": measured, "share": measured / step_s,
                     "predicted_s": predicted, "predicted_from": source, "top_kernels": "", "error": ""})
    return [{column: row[column] for column in COLUMNS} for row in rows]
