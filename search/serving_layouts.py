"""Choose a serving layout: tensor, pipeline and data (replica) degrees for prefill or decode.

Every split of the mesh (or of the device count) into ``dp · tp · pp`` is simulated
(`costmodel.step.inference`); on a TPU slice's torus, without a given mesh, a decode step's tensor
devices also as each 2D weight-stationary split (`Layout.tp_embed`) the model and batch divide (Pope
et al.'s layout for TPU ICI; on GPUs NCCL's small-message algorithms, which the collective model
does not have, would decide, so only `plan simulate --tp-embed` costs one there). Of the layouts
that fit in HBM, the objective depends on the batch:

- Latency, when a replica's step runs fewer tokens than the device needs to be compute-bound
  (`compute_bound_tokens`: the linear layers' peak FLOP/s over HBM bytes/s, times the bytes
  of a stored weight, halved for the multiply-add; about 295 on an H100 in bf16): the step
  is bound by reading the weights, so more replicas add tokens/s only by holding more
  requests at once, while splitting the weights cuts every request's latency. The least
  time per output token (decode) or time to first token (prefill) wins.
- Throughput otherwise, and always under ``max_token_latency_ms``: the most tokens/s (decode:
  output tokens; prefill: prompt tokens) among the layouts whose time per output token is
  within the bound.

Ties go to the other objective. Nothing fits: one line naming the smallest memory reached;
nothing within the latency bound: one line naming the best latency reachable.

>>> from costmodel.hardware.machine import load_machine
>>> from costmodel.inputs.train_config import TrainConfig
>>> from planner.config import load_model
>>> train = TrainConfig(workload="decode", global_batch=512, seq_len=512)
>>> choice = choose_serving_layout(load_model("llama3-8b"), train, load_machine("h100-sxm"), splits=None, n_devices=8)
>>> (choice.best.layout.dp, choice.best.layout.tp, choice.best.layout.pp), choice.latency_bound
((8, 1, 1), False)
>>> small = train.model_copy(update={"global_batch": 1})
>>> choice = choose_serving_layout(load_model("llama3-8b"), small, load_machine("h100-sxm"), splits=None, n_devices=8)
>>> (choice.best.layout.dp, choice.best.layout.tp, choice.best.layout.pp), choice.objective.split(":")[0]
((1, 8, 1), 'latency')
>>> bounded = TrainConfig(workload="decode", global_batch=64, seq_len=4096, inference={"max_token_latency_ms": 7.0})
>>> choice = choose_serving_layout(load_model("llama3-8b"), bounded, load_machine("h100-sxm"), splits=None, n_devices=8)
>>> (choice.best.layout.dp, choice.best.layout.tp, choice.best.layout.pp), choice.latency_bound
((1, 8, 1), True)
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.errors import InfeasibleError, InvalidPlanError, UnsupportedError
from costmodel.hardware.machine import Machine
from costmodel.inputs.layout import Layout, check_tensor_2d
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.estimate import StepEstimate
from costmodel.step.inference import simulate_inference

_GIB = 2**30
RUNNERS_UP = 4
_UNEVEN_2D = "2D weight-stationary split that does not divide the model dimension, KV heads, MLP width or batch"


@dataclass(frozen=True)
class ServingChoice:
    """The chosen layout's estimate, the best of the rest, and how the choice was made."""

    best: StepEstimate
    runners_up: tuple[tuple[StepEstimate, str], ...]  # (estimate, why it lost)
    evaluated: int
    pruned: dict[str, int]
    latency_bound: bool  # a layout with more tokens/s was refused for exceeding the latency bound
    objective: str  # what the layouts were ranked by, and why (module docstring)


def _splits_of(n_devices: int) -> list[tuple[int, int, int, int]]:
    return [(n_devices // (tp * pp), tp, pp, 1) for tp in range(1, n_devices + 1) if n_devices % tp == 0
            for pp in range(1, n_devices // tp + 1) if (n_devices // tp) % pp == 0]


def _two_d_layouts(model: ModelConfig, train: TrainConfig, dp: int, tp: int, pp: int, pruned: dict[str, int]) -> list[Layout]:
    """The 2D weight-stationary splits of ``tp`` devices a decode step can run (`Layout.tp_embed`); the
    splits the model's sizes or the batch refuse are counted in ``pruned`` under one rule."""
    if not train.workload.splits_model_dimension or tp == 1:
        return []
    candidates = [Layout(dp=dp, tp=tp, pp=pp, tp_embed=x) for x in range(2, tp + 1) if tp % x == 0]
    kept = []
    for layout in candidates:
        try:
            check_tensor_2d(layout, model, train.model_copy(update={"global_batch": train.global_batch * dp}))
            kept.append(layout)
        except InvalidPlanError:
            pruned[_UNEVEN_2D] = pruned.get(_UNEVEN_2D, 0) + 1
    return kept


def compute_bound_tokens(train: TrainConfig, machine: Machine) -> float:
    """Tokens one step must run for its matmuls to take as long as reading the weights once: below
    it the step is HBM-bound. ``peak FLOP/s / HBM bytes/s × bytes per weight / 2`` (two FLOPs per
    weight per token; the KV cache's reads only raise it).

    >>> from costmodel.hardware.machine import load_machine
    >>> round(compute_bound_tokens(TrainConfig(workload="decode"), load_machine("h100-sxm")))
    295
    """
    return machine.linear_peak / machine.hbm_bytes_per_s * train.workload.frozen_dtype.bytes / 2


def step_tokens(train: TrainConfig) -> int:
    """Tokens one step of a replica runs without pipelining: its batch (decode) or its batch's prompts (prefill)."""
    sequences = train.workload.step_sequences(micro_batch=train.global_batch, replica_batch=train.global_batch)
    return sequences * train.workload.new_tokens(prompt_len=train.prompt_len)


def _latency_s(est: StepEstimate, train: TrainConfig) -> float:
    return train.workload.step_time_s(time_per_output_token_s=est.time_per_output_token_s,
                                      time_to_first_token_s=est.time_to_first_token_s)


def choose_serving_layout(model: ModelConfig, train: TrainConfig, machine: Machine, *,
                          splits: tuple[tuple[int, int, int, int], ...] | None, n_devices: int) -> ServingChoice:
    """The serving layout that fits with the least latency (a small batch) or the most tokens/s within the latency
    bound (module docstring);
    ``splits`` are the (dp, tp, pp, cp) degrees a given mesh can carry, None for any split of ``n_devices``."""
    estimates, pruned = [], {}
    two_d = splits is None and bool(machine.intra.torus_dims)
    for dp, tp, pp, cp in splits or _splits_of(n_devices):
        if cp > 1:
            continue
        for layout in [Layout(dp=dp, tp=tp, pp=pp), *(_two_d_layouts(model, train, dp, tp, pp, pruned) if two_d else ())]:
            try:
                estimates.append(simulate_inference(model, train, layout, machine))
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
            f"{least.memory.total_bytes / _GIB:.1f} GiB ({least.layout.degrees_text}, KV cache "
            f"{least.memory.kv_cache_bytes / _GIB:.1f} GiB), exceeds {least.memory.limit_text()}",
            fix="use more devices, a smaller --batch or --context-len, or --frozen-dtype int8 / int4")
    bound_ms = train.workload.serving.max_token_latency_ms
    within = [e for e in fitting if bound_ms is None or _latency_s(e, train) * 1e3 <= bound_ms]
    if not within:
        quickest = min(fitting, key=lambda e: _latency_s(e, train))
        raise InfeasibleError(
            f"no layout of {n_devices}× {machine.name} decodes {model.name} at batch {train.global_batch} within {bound_ms:g} ms "
            f"per output token: the best reachable is {_latency_s(quickest, train) * 1e3:.2f} ms "
            f"({quickest.layout.degrees_text})",
            fix=f"raise --max-token-latency-ms to {_latency_s(quickest, train) * 1e3:.2f} or more, "
                "or use a smaller --batch or more devices")

    for_latency = bound_ms is None and step_tokens(train) < compute_bound_tokens(train, machine)

    def rank(e: StepEstimate) -> tuple[float, float]:
        return (_latency_s(e, train), -e.tokens_per_s) if for_latency else (-e.tokens_per_s, _latency_s(e, train))

    best = min(within, key=rank)
    latency_bound = any(e.tokens_per_s > best.tokens_per_s for e in fitting if e not in within)
    runners_up = [(e, _why(e, best, train, for_latency=for_latency))
                  for e in sorted((e for e in estimates if e is not best), key=rank)]
    shown = runners_up[:RUNNERS_UP]
    # The best layout of the other tensor split (1D beside a chosen 2D one, or 2D beside 1D), when costed, is always shown.
    if not any((e.layout.tp_embed > 1) != (best.layout.tp_embed > 1) for e, _ in shown):
        shown += [r for r in runners_up if (r[0].layout.tp_embed > 1) != (best.layout.tp_embed > 1)][:1]
    return ServingChoice(best=best, runners_up=tuple(shown), evaluated=len(estimates), pruned=pruned,
                         latency_bound=latency_bound, objective=_objective(best, runners_up, train, machine, for_latency=for_latency))


def _objective(best: StepEstimate, runners_up: list[tuple[StepEstimate, str]], train: TrainConfig, machine: Machine, *,
               for_latency: bool) -> str:
    """Why the chosen layout won, in one sentence: the objective and the rule that set it."""
    latency = train.workload.of_step(decode="time per output token", prefill="time to first token")
    tokens = train.workload.of_step(decode="output", prefill="prompt")
    step = train.workload.of_step(decode=f"{train.global_batch} sequence(s)",
                                  prefill=f"{train.global_batch} × {train.prompt_len} prompt tokens")
    ridge = f"the {compute_bound_tokens(train, machine):.0f} tokens a step needs to be compute-bound on {machine.name}"
    if for_latency:
        return (f"latency: the least {latency} of the layouts that fit; {step} per replica is below {ridge}, so more replicas "
                "would add tokens/s only by serving more requests at once (--max-token-latency-ms: the most tokens/s within a bound)")
    bound_ms = train.workload.serving.max_token_latency_ms
    if bound_ms is None:
        return f"throughput: the most {tokens} tokens/s of the layouts that fit; {step} per replica reach {ridge}"
    rival = next((e for e, _ in runners_up if e.fits and e.tokens_per_s > best.tokens_per_s), None)
    if rival is None:
        return f"throughput: the most {tokens} tokens/s of the layouts that fit, within {bound_ms:g} ms per token"
    return (f"latency-bound: {rival.layout.degrees_text} would serve more tokens/s "
            f"but takes {_latency_s(rival, train) * 1e3:.2f} ms per token, over the {bound_ms:g} ms bound")


def _why(e: StepEstimate, best: StepEstimate, train: TrainConfig, *, for_latency: bool) -> str:
    """Why ``e`` lost to ``best``: memory, the latency bound, a longer latency or fewer tokens/s."""
    if not e.fits:
        return f"does not fit: needs {e.memory.total_bytes / _GIB:.1f} GiB per device, over {e.memory.limit_text()}"
    latency_ms = _latency_s(e, train) * 1e3
    bound_ms = train.workload.serving.max_token_latency_ms
    if bound_ms is not None and latency_ms > bound_ms:
        return f"{e.tokens_per_s:,.0f} tokens/s but {latency_ms:.2f} ms per output token, over the {bound_ms:g} ms bound"
    if for_latency:
        return (f"{100 * (latency_ms / (_latency_s(best, train) * 1e3) - 1):.1f} % slower ({latency_ms:.2f} ms; "
                f"{e.tokens_per_s:,.0f} tokens/s)")
    return f"{100 * (1 - e.tokens_per_s / best.tokens_per_s):.1f} % fewer tokens/s ({e.tokens_per_s:,.0f}; {latency_ms:.2f} ms)"
