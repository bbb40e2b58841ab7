"""Choose a serving layout: tensor, pipeline and data (replica) degrees for prefill or decode.

Every split of the mesh (or of the device count) into ``dp · tp · pp`` is simulated
(`costmodel.step.inference`). Decode takes the most output tokens/s among the layouts that fit
in HBM and whose time per output token is within ``max_token_latency_ms``; prefill the
most prompt tokens/s. Ties go to the shorter latency. Nothing fits: one line naming the
smallest memory reached; nothing within the latency bound: one line naming the best
latency reachable.

>>> from costmodel.hardware.machine import load_machine
>>> from costmodel.inputs.train_config import TrainConfig
>>> from planner.config import load_model
>>> train = TrainConfig(workload="decode", global_batch=64, seq_len=4096)
>>> choice = choose_serving_layout(load_model("llama3-8b"), train, load_machine("h100-sxm"), splits=None, n_devices=8)
>>> (choice.best.layout.dp, choice.best.layout.tp, choice.best.layout.pp), choice.latency_bound
((8, 1, 1), False)
>>> bounded = train.model_copy(update={"workload": train.workload.model_copy(
...     update={"serving": train.workload.serving.model_copy(update={"max_token_latency_ms": 5.0})})})
>>> choice = choose_serving_layout(load_model("llama3-8b"), bounded, load_machine("h100-sxm"), splits=None, n_devices=8)
>>> (choice.best.layout.dp, choice.best.layout.tp, choice.best.layout.pp), choice.latency_bound
((1, 8, 1), True)
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.errors import InfeasibleError, InvalidPlanError, UnsupportedError
from costmodel.hardware.machine import Machine
from costmodel.inputs.layout import Layout
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.estimate import StepEstimate
from costmodel.step.inference import simulate_inference

_GIB = 2**30
RUNNERS_UP = 4


@dataclass(frozen=True)
class ServingChoice:
    """The chosen layout's estimate, the best of the rest, and how the choice was made."""

    best: StepEstimate
    runners_up: tuple[tuple[StepEstimate, str], ...]  # (estimate, why it lost)
    evaluated: int
    pruned: dict[str, int]
    latency_bound: bool  # a layout with more tokens/s was refused for exceeding the latency bound


def _splits_of(n_devices: int) -> list[tuple[int, int, int, int]]:
    return [(n_devices // (tp * pp), tp, pp, 1) for tp in range(1, n_devices + 1) if n_devices % tp == 0
            for pp in range(1, n_devices // tp + 1) if (n_devices // tp) % pp == 0]


def _latency_s(est: StepEstimate, train: TrainConfig) -> float:
    return train.workload.step_time_s(time_per_output_token_s=est.time_per_output_token_s,
                                      time_to_first_token_s=est.time_to_first_token_s)


def choose_serving_layout(model: ModelConfig, train: TrainConfig, machine: Machine, *,
                          splits: tuple[tuple[int, int, int, int], ...] | None, n_devices: int) -> ServingChoice:
    """The serving layout with the most tokens/s that fits and meets the latency bound (module docstring);
    ``splits`` are the (dp, tp, pp, cp) degrees a given mesh can carry, None for any split of ``n_devices``."""
    estimates, pruned = [], {}
    for dp, tp, pp, cp in splits or _splits_of(n_devices):
        if cp > 1:
            continue
        try:
            estimates.append(simulate_inference(model, train, Layout(dp=dp, tp=tp, pp=pp), machine))
        except (InvalidPlanError, UnsupportedError) as err:
            pruned[str(err).split(";")[0]] = pruned.get(str(err).split(";")[0], 0) + 1
    if not estimates:
        raise InfeasibleError(f"no split of {n_devices} devices can serve {model.name} at batch {train.global_batch}",
                              fix="use a batch that the data-parallel degree divides, or another mesh")
    fitting = [e for e in estimates if e.fits]
    if not fitting:
        least = min(estimates, key=lambda e: e.memory.total_bytes)
        raise InfeasibleError(
            f"{model.name} does not fit for {train.workload.kind} on {n_devices}× {machine.name}: the least memory per device, "
            f"{least.memory.total_bytes / _GIB:.1f} GiB (dp{least.layout.dp} tp{least.layout.tp} pp{least.layout.pp}, KV cache "
            f"{least.memory.kv_cache_bytes / _GIB:.1f} GiB), exceeds {machine.hbm_bytes / _GIB:.0f} GiB",
            fix="use more devices, a smaller --batch or --context-len, or --frozen-dtype int8 / int4")
    bound_ms = train.workload.serving.max_token_latency_ms
    within = [e for e in fitting if bound_ms is None or _latency_s(e, train) * 1e3 <= bound_ms]
    if not within:
        quickest = min(fitting, key=lambda e: _latency_s(e, train))
        raise InfeasibleError(
            f"no layout of {n_devices}× {machine.name} decodes {model.name} at batch {train.global_batch} within {bound_ms:g} ms "
            f"per output token: the best reachable is {_latency_s(quickest, train) * 1e3:.2f} ms (dp{quickest.layout.dp} "
            f"tp{quickest.layout.tp} pp{quickest.layout.pp})",
            fix=f"raise --max-token-latency-ms to {_latency_s(quickest, train) * 1e3:.2f} or more, "
                "or use a smaller --batch or more devices")

    def rank(e: StepEstimate) -> tuple[float, float]:
        return -e.tokens_per_s, _latency_s(e, train)

    best = min(within, key=rank)
    latency_bound = any(e.tokens_per_s > best.tokens_per_s for e in fitting if e not in within)
    runners_up = [(e, _why(e, best, train)) for e in sorted((e for e in estimates if e is not best), key=rank)]
    return ServingChoice(best=best, runners_up=tuple(runners_up[:RUNNERS_UP]), evaluated=len(estimates), pruned=pruned,
                         latency_bound=latency_bound)


def _why(e: StepEstimate, best: StepEstimate, train: TrainConfig) -> str:
    """Why ``e`` lost to ``best``: memory, the latency bound, or fewer tokens/s."""
    if not e.fits:
        return f"does not fit: needs {e.memory.total_bytes / _GIB:.1f} GiB per device, has {e.memory.hbm_bytes / _GIB:.0f} GiB"
    latency_ms = _latency_s(e, train) * 1e3
    bound_ms = train.workload.serving.max_token_latency_ms
    if bound_ms is not None and latency_ms > bound_ms:
        return f"{e.tokens_per_s:,.0f} tokens/s but {latency_ms:.2f} ms per output token, over the {bound_ms:g} ms bound"
    return f"{100 * (1 - e.tokens_per_s / best.tokens_per_s):.1f} % fewer tokens/s ({e.tokens_per_s:,.0f}; {latency_ms:.2f} ms)"
