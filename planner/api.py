"""The library entry point: ``planner.plan(model, mesh="8x4", hardware="h100-sxm") -> Plan``.

>>> p = plan("gpt2", mesh="2x4", hardware="a100-80gb", global_batch=64, seq_len=1024)
>>> p.layout.n_devices, [a.parallelism for a in p.mesh][:2] != []
(8, True)
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from costmodel.errors import InfeasibleError, InvalidConfigError, UnsupportedError
from costmodel.step.estimate import StepEstimate
from costmodel.hardware.profile import ClusterSpec, load_hardware
from costmodel.inputs.layout import Layout, Offload, check_sequence
from costmodel.hardware.machine import Machine, train_machine
from costmodel.step.memory import min_state_bytes_per_device
from costmodel.hardware.mesh import MeshSpec, axis_links, parse_mesh
from costmodel.inputs.model_config import ModelConfig
from costmodel.step.run_overheads import RunSettings, run_overheads
from costmodel.step.simulator import simulate
from costmodel.inputs.stack import Attention, SoftwareStack, get_stack, stack_with
from costmodel.inputs.train_config import Precision, TrainConfig
from costmodel.inputs.workload import InferenceConfig, LoraConfig, WorkloadKind, adapter_params_per_layer
from planner.config import default_seq_len, load_model, train_config
from planner.mesh_assign import AXIS_NAMES, KINDS, assignments, degrees
from planner.plan_schema import Alternative, IntraOpInfo, MeshAxis, Plan, SolverInfo
from search.serving_layouts import ServingChoice, choose_serving_layout
from planner.shardings import logical_rules, param_specs
from search.layouts import NothingFitsError, SearchSpace, grid_search

_GIB = 2**30
PLANNERS = ("grid", "ilp", "anneal", "beam", "random")
MAX_DEVICES = 2**24  # keeps enumerating degree splits well under a second
Report = Callable[[str, int, int | None], None]  # (phase, done, total or None when unknown)


def plan(
    model: str | ModelConfig, *, mesh: str | None = None, devices: int | None = None, hardware: str = "h100-sxm",
    seq_len: int | None = None, global_batch: int = 256, devices_per_node: int | None = None,
    planner: str = "grid", time_limit_s: float = 20.0, seed: int = 0, attention: Attention | None = None,
    progress: Report | None = None, tokens: float | None = None, stack: str | SoftwareStack = "jax",
    precision: Precision | str = Precision.BF16, workload: WorkloadKind | str = WorkloadKind.PRETRAIN,
    lora: LoraConfig | None = None, inference: InferenceConfig | None = None, run: RunSettings | None = None,
    offload: Offload | str | None = None,
) -> Plan:
    """Choose the fastest layout that fits for ``model`` on ``mesh`` (or on ``devices``).

    Args:
      model: preset name, config.json path, or a ModelConfig.
      mesh: device mesh, e.g. "8x4" or "data=8,tensor=4"; or give ``devices`` and let the planner shape it.
      hardware: hardware profile name or JSON path.
      planner: "grid" (layout search, rule-based Megatron shardings) or "ilp" (the same layout
        search, then the CP-SAT intra-op ILP shards each stage's training step on its sub-mesh),
        or "anneal" / "beam" / "random", search planners on the ILP's strategy space.
      time_limit_s: the layout search and the intra-op planner each stop after this many
        seconds and keep the best found; ``solver.status`` is then FEASIBLE, not OPTIMAL.
      seed: the intra-op planner's random seed.
      attention: the attention kernel the layout is chosen for; default the stack's for grid
        and materialized for the intra-op planners, which shard the reference program (it
        materializes the score matrix).
      stack: the software stack (`costmodel.inputs.stack.STACKS` name or a `SoftwareStack`) whose
        step time the layout is chosen for; default "jax", the program `plan validate` lowers.
        Another stack predicts how that framework would run the chosen layout.
      precision: "fp32", "tf32" (fp32 storage, GEMMs at the tf32 peak), "bf16", "fp16" (fp16 gradients,
        dynamic loss scaling) or "fp8" (bf16, the linear layers' GEMMs in fp8 as Transformer Engine runs
        them; `costmodel.step.fp8_memory`); a part without the dtype's peak is refused (`InvalidConfigError`).
      progress: called as ``progress(phase, done, total)`` while the search runs.
      tokens: training tokens; the plan's prediction then says how long training takes
        (``time_to_train_s``: tokens / tokens_per_s at the chosen layout, plus ``input_overhead_s``
        and ``checkpoint_overhead_s``, itemised in ``run_overheads``) and ``device_hours``.
      offload: "none" (never), "optimizer" (always: ZeRO-Offload's optimizer state and Adam on the
        host, `costmodel.step.offload`) or None, the planner's choice: offload only when no layout fits
        in device memory without, and say so in ``solver.offload_reason``.
      run: the checkpoint interval and loader the time to train assumes (default
        `costmodel.step.run_overheads.RunSettings`: a checkpoint every hour, a prefetching loader).
      workload: "pretrain", "finetune-full" (the same step) or "finetune-lora" (frozen base
        weights, trained adapters; ``lora`` sets rank, targets and the frozen weights' storage,
        default `costmodel.inputs.workload.LoraConfig`). LoRA plans use the grid planner, without
        pipeline stages (the validator lowers LoRA without them). "prefill" or "decode" serve
        the model (`search.serving_layouts`): ``global_batch`` sequences at a context of
        ``seq_len`` tokens, ``inference`` the rest (prompt length, KV block size, the per-token
        latency bound, weight storage; default `costmodel.inputs.workload.InferenceConfig`).

    The plan holds no wall times, so the same inputs give the same plan bytes.

    >>> p = plan("llama3-8b", mesh="8", workload="finetune-lora", global_batch=64)
    >>> p.workload, p.train.lora.rank, p.predicted.memory.frozen_params_bytes > p.predicted.memory.optimizer_bytes
    ('finetune-lora', 16, True)
    >>> d = plan("llama3-8b", mesh="8", workload="decode", global_batch=64, seq_len=4096,
    ...          inference=InferenceConfig(max_token_latency_ms=5))
    >>> d.layout.tp, d.predicted.time_per_output_token_s < 0.01, d.predicted.memory.kv_cache_bytes / 2**30
    (8, True, 4.0)
    """
    _check_arguments(planner=planner, devices=devices, time_limit_s=time_limit_s)
    cfg = model if isinstance(model, ModelConfig) else load_model(model)
    train = train_config(seq_len=seq_len or default_seq_len(cfg), global_batch=global_batch, workload=workload,
                         lora=lora, inference=inference).with_precision(Precision(precision))
    if (train.is_lora or train.is_inference) and planner != "grid":
        raise UnsupportedError(f"--planner {planner} shards the pretraining step only; {train.workload.value} plans use the grid planner",
                               fix="drop --planner or use --planner grid")
    if train.is_fp8 and planner != "grid":
        raise UnsupportedError(f"--planner {planner} costs every GEMM at one peak; fp8 plans use the grid planner",
                               fix="drop --planner or use --planner grid")
    check_sequence(cfg, train)
    offload = _offload_choice(offload, planner)
    cluster = load_hardware(hardware, devices_per_node=devices_per_node)
    machine = train_machine(cluster, train)
    software = get_stack(stack) if isinstance(stack, str) else stack
    if (mesh is None) == (devices is None):
        raise InvalidConfigError("give exactly one of --mesh and --devices", fix="e.g. --mesh 8x4 or --devices 32")
    mesh_spec = parse_mesh(mesh) if mesh is not None else None  # "" is a malformed mesh, not a missing one
    kinds_options = assignments(mesh_spec) if mesh_spec else []
    splits = tuple(sorted({degrees(mesh_spec, k) for k in kinds_options})) if mesh_spec else None
    n_devices = mesh_spec.n_devices if mesh_spec else devices
    if n_devices > MAX_DEVICES:
        raise InvalidConfigError(f"{n_devices:,} devices exceed the {MAX_DEVICES:,} this planner supports",
                                 fix="plan one replica group and scale data parallelism by hand")
    if train.is_inference:
        return _serving_plan(cfg, train, cluster, machine, mesh_spec=mesh_spec, n_devices=n_devices, splits=splits)
    _check_any_cluster_holds(cfg, train, machine)
    # An intra-op planner shards the reference program, which materializes attention
    # scores: choose the layout (micro-batch, recompute) for that program's memory.
    attention = attention or (software.attention if planner == "grid" else Attention.MATERIALIZED)
    on_progress = (lambda done, total: progress("layout search", done, total)) if progress else None
    space = SearchSpace(splits=splits, stack=Layout(stack=stack_with(software, attention=attention), offload=offload or Offload.NONE),
                        lowered_only=True, intra_op=planner != "grid",
                        offload_when_nothing_fits=offload is None and planner == "grid")
    try:
        result = grid_search(cfg, train, machine, n_devices=n_devices, space=space, time_limit_s=time_limit_s, on_progress=on_progress)
    except InfeasibleError as err:
        if offload is Offload.NONE and machine.host is not None and isinstance(err, NothingFitsError) and not train.is_lora:
            raise InfeasibleError(err.cause, fix=f"{err.fix}, or let the optimizer state go to the host (--offload optimizer)") from None
        raise
    best = result.best
    lay = best.layout
    if mesh_spec is None:
        mesh_spec, kinds = _derived_mesh(lay.dp, lay.tp, lay.pp, lay.cp)
    else:
        kinds = next(k for k in kinds_options if degrees(mesh_spec, k) == (lay.dp, lay.tp, lay.pp, lay.cp))
    axes = _mesh_axes(mesh_spec, kinds, cluster)
    by_kind = _axes_by_kind(axes)
    specs = param_specs(cfg, logical_rules(lay, by_kind, cfg), mesh_spec.shape)
    intra_op = None
    if planner != "grid":
        from planner.intraop.stage import intra_op_axes, intra_op_specs  # jax tracing and OR-Tools only when asked for

        ilp_axes = intra_op_axes(axes)
        if ilp_axes:
            if progress:
                progress(f"intra-op {planner}: trace, build, solve (limit {time_limit_s:g} s)", 0, None)
            specs, intra_op = intra_op_specs(cfg, train, lay, ilp_axes, machine, planner=planner,
                                             time_limit_s=time_limit_s, seed=seed)
    return Plan(
        model=cfg, train=train, hardware=cluster.name, mesh=axes, layout=lay,
        param_specs=specs, activation_specs=_activation_specs(lay, by_kind),
        predicted=with_training_time(best, tokens, model=cfg, train=train, cluster=cluster, run=run),
        alternatives=_alternatives(result.runners_up, result.closest_misses, best.step_time_s, machine.hbm_bytes),
        solver=SolverInfo(planner=planner, status=_status(result.complete, intra_op), evaluated=result.evaluated,
                          pruned=result.pruned, intra_op=intra_op, offload_reason=result.offload_reason),
    )


def _offload_choice(offload: Offload | str | None, planner: str) -> Offload | None:
    """``offload`` as an `Offload` (None: the planner's choice), refused where it is not planned."""
    if offload is None:
        return None
    if offload not in set(Offload):
        raise InvalidConfigError(f"unknown offload {offload!r}", fix=f"use one of: {', '.join(o.value for o in Offload)}")
    if Offload(offload) is Offload.OPTIMIZER and planner != "grid":
        raise UnsupportedError(f"--planner {planner} does not plan offloaded layouts", fix="use --planner grid or --offload none")
    return Offload(offload)


def _serving_plan(cfg: ModelConfig, train: TrainConfig, cluster: ClusterSpec, machine: Machine, *, mesh_spec: MeshSpec | None,
                  n_devices: int, splits: tuple[tuple[int, int, int, int], ...] | None) -> Plan:
    """The plan of a prefill or decode workload: the serving layout `choose_serving_layout` takes, Megatron shardings."""
    choice: ServingChoice = choose_serving_layout(cfg, train, machine, splits=splits, n_devices=n_devices)
    lay = choice.best.layout
    if mesh_spec is None:
        mesh_spec, kinds = _derived_mesh(lay.dp, lay.tp, lay.pp, lay.cp)
    else:
        kinds = next(k for k in assignments(mesh_spec) if degrees(mesh_spec, k) == (lay.dp, lay.tp, lay.pp, lay.cp))
    axes = _mesh_axes(mesh_spec, kinds, cluster)
    by_kind = _axes_by_kind(axes)
    alternatives = tuple(Alternative(layout=e.layout, step_time_s=e.step_time_s, memory_bytes=e.memory.total_bytes, why=why)
                         for e, why in choice.runners_up)
    return Plan(model=cfg, train=train, hardware=cluster.name, mesh=axes, layout=lay,
                param_specs=param_specs(cfg, logical_rules(lay, by_kind, cfg), mesh_spec.shape),
                activation_specs=_activation_specs(lay, by_kind), predicted=choice.best, alternatives=alternatives,
                solver=SolverInfo(planner="grid", status="OPTIMAL", evaluated=choice.evaluated, pruned=choice.pruned))


def layout_plan(
    model: str | ModelConfig, layout: Layout, *, mesh: str | None = None, hardware: str = "h100-sxm",
    seq_len: int | None = None, global_batch: int = 256, devices_per_node: int | None = None,
    workload: WorkloadKind | str = WorkloadKind.PRETRAIN, lora: LoraConfig | None = None, inference: InferenceConfig | None = None,
    precision: Precision | str = Precision.BF16,
) -> Plan:
    """The plan for a layout chosen by hand: mesh roles, Megatron shardings, simulated prediction.

    What a user compares with `plan`'s choice, and what the validator's timed checks run.
    Without ``mesh``, one axis per parallelism (pipeline, data, context, tensor; major first).

    >>> p = layout_plan("gpt2", Layout(dp=2, tp=4, micro_batch=8), hardware="a100-80gb", global_batch=64, seq_len=1024)
    >>> [(a.name, a.size, a.parallelism) for a in p.mesh], p.param_specs["layers/mlp/w_in"]
    ([('data', 2, 'dp'), ('tensor', 4, 'tp')], (None, None, 'tensor'))
    """
    cfg = model if isinstance(model, ModelConfig) else load_model(model)
    train = train_config(seq_len=seq_len or default_seq_len(cfg), global_batch=global_batch, workload=workload, lora=lora,
                         inference=inference).with_precision(Precision(precision))
    check_sequence(cfg, train)
    cluster = load_hardware(hardware, devices_per_node=devices_per_node)
    machine = train_machine(cluster, train)
    estimate = simulate(cfg, train, layout, machine)
    layout = estimate.layout if train.is_inference else layout  # serving sets the micro-batch itself
    wanted = (layout.dp, layout.tp, layout.pp, layout.cp)
    if mesh is None:
        mesh_spec, kinds = _derived_mesh(*wanted)
    else:
        mesh_spec = parse_mesh(mesh)
        kinds = next((k for k in assignments(mesh_spec) if degrees(mesh_spec, k) == wanted), None)
        if kinds is None:
            raise InvalidConfigError(f"mesh {mesh} cannot carry dp={layout.dp}, tp={layout.tp}, pp={layout.pp}, cp={layout.cp}",
                                     fix="give a mesh whose axis sizes are those degrees, or leave the mesh out")
    axes = _mesh_axes(mesh_spec, kinds, cluster)
    by_kind = _axes_by_kind(axes)
    return Plan(
        model=cfg, train=train, hardware=cluster.name, mesh=axes, layout=layout,
        param_specs=param_specs(cfg, logical_rules(layout, by_kind, cfg), mesh_spec.shape),
        activation_specs=_activation_specs(layout, by_kind), predicted=estimate, alternatives=(),
        solver=SolverInfo(planner="fixed", status="GIVEN", evaluated=1, pruned={}),
    )


def with_training_time(est: StepEstimate, tokens: float | None, *, model: ModelConfig, train: TrainConfig, cluster: ClusterSpec,
                       run: RunSettings | None = None) -> StepEstimate:
    """``est`` with the time and device-hours to train on ``tokens`` (unchanged when None): the steps,
    the input pipeline's stalls and the checkpoint writes at ``cluster``'s storage rates
    (`costmodel.step.run_overheads`). ``time_to_train_s / 86400`` is days to train.

    >>> from costmodel.hardware.catalog import CATALOG
    >>> p = plan("gpt2", mesh="8", global_batch=64)
    >>> t = with_training_time(p.predicted, 1e10, model=p.model, train=p.train, cluster=CATALOG["h100-sxm"]).run_overheads
    >>> t.total_s == t.steps_s + t.input_overhead_s + t.checkpoint_overhead_s, t.token_bytes
    (True, 2)
    """
    if tokens is None:
        return est
    if not (math.isfinite(tokens) and tokens > 0):
        raise InvalidConfigError(f"{tokens=} is not a positive token count", fix="e.g. --tokens 15e12")
    trained = model.num_layers * adapter_params_per_layer(model, train.lora) if train.is_lora else model.total_params
    run_time = run_overheads(tokens=tokens, tokens_per_step=train.tokens_per_step, step_time_s=est.step_time_s,
                             n_devices=est.n_devices, trained_params=trained, train=train, vocab_size=model.vocab_size,
                             storage=cluster.storage, settings=run)
    return est.model_copy(update={"time_to_train_s": run_time.total_s, "device_hours": run_time.total_s * est.n_devices / 3600,
                                  "input_overhead_s": run_time.input_overhead_s,
                                  "checkpoint_overhead_s": run_time.checkpoint_overhead_s, "run_overheads": run_time})


def _check_arguments(*, planner: str, devices: int | None, time_limit_s: float) -> None:
    if planner not in PLANNERS:
        raise InvalidConfigError(f"unknown planner {planner!r}", fix=f"use one of {', '.join(PLANNERS)}")
    if devices is not None and devices < 1:
        raise InvalidConfigError(f"--devices={devices} is not a positive device count", fix="give at least 1 device")
    if not time_limit_s > 0:  # also catches NaN
        raise InvalidConfigError(f"--time-limit-s={time_limit_s} is not a positive number of seconds", fix="e.g. --time-limit-s 20")


def _check_any_cluster_holds(cfg: ModelConfig, train: TrainConfig, machine: Machine) -> None:
    """Refuse, by arithmetic on the parameter count, a model whose training state would not fit even
    spread over the largest cluster this planner takes; nearer misses get the search's closest layouts."""
    need_bytes = min_state_bytes_per_device(cfg, train, MAX_DEVICES)
    if need_bytes > machine.hbm_bytes:
        raise InfeasibleError(
            f"{cfg.name} cannot fit on any cluster: its {cfg.total_params:.3g} parameters' weights, gradients and optimizer "
            f"state alone need {need_bytes / _GIB:,.0f} GiB per device even spread over {MAX_DEVICES:,} devices, "
            f"more than the {machine.hbm_bytes / _GIB:.0f} GiB of one {machine.name}",
            fix="check num_hidden_layers and the other sizes in the model config",
        )


def _status(layouts_complete: bool, intra_op: IntraOpInfo | None) -> str:
    """OPTIMAL only when every layout was costed and the intra-op planner (if any) proved its choice."""
    return "OPTIMAL" if layouts_complete and (intra_op is None or intra_op.status == "OPTIMAL") else "FEASIBLE"


def _mesh_axes(mesh_spec: MeshSpec, kinds: tuple[str, ...], cluster: ClusterSpec) -> tuple[MeshAxis, ...]:
    links = axis_links(mesh_spec, cluster)
    return tuple(MeshAxis(name=n, size=s, parallelism=k, links=links[n].tiers, nodes_spanned=links[n].nodes_per_group)
                 for n, s, k in zip(mesh_spec.axis_names, mesh_spec.axis_sizes, kinds))


def _axes_by_kind(axes: tuple[MeshAxis, ...]) -> dict[str, tuple[str, ...]]:
    return {k: tuple(a.name for a in axes if a.parallelism == k and a.size > 1) for k in KINDS}


def _activation_specs(lay: Layout, by_kind: dict[str, tuple[str, ...]]) -> dict[str, tuple]:
    data, tensor = by_kind["dp"] or None, by_kind["tp"] or None
    return {
        "residual_BxSxD": (data, tensor if lay.sequence_parallel else None, None),
        "attention_heads_BxSxNxH": (data, None, tensor, None),
        "mlp_hidden_BxSxF": (data, None, tensor),
        "logits_BxSxV": (data, None, tensor),
    }


def _derived_mesh(dp: int, tp: int, pp: int, cp: int) -> tuple[MeshSpec, tuple[str, ...]]:
    sizes = {"pp": pp, "dp": dp, "cp": cp, "tp": tp}
    kinds = tuple(k for k in ("pp", "dp", "cp", "tp") if sizes[k] > 1) or ("dp",)
    return MeshSpec(axis_names=tuple(AXIS_NAMES[k] for k in kinds), axis_sizes=tuple(sizes[k] for k in kinds)), kinds


def _alternatives(runners_up: tuple[StepEstimate, ...], misses: tuple[StepEstimate, ...], best_s: float,
                  hbm_bytes: float) -> tuple[Alternative, ...]:
    out = [Alternative(layout=e.layout, step_time_s=e.step_time_s, memory_bytes=e.memory.total_bytes,
                       why=f"{100 * (e.step_time_s / best_s - 1):.1f} % slower ({e.step_time_s:.3f} s)") for e in runners_up]
    out += [Alternative(layout=e.layout, step_time_s=e.step_time_s, memory_bytes=e.memory.total_bytes,
                        why=f"does not fit: needs {e.memory.total_bytes / _GIB:.1f} GiB per device, has {hbm_bytes / _GIB:.0f} GiB")
            for e in misses]
    return tuple(out)


def check_shard(result: Any, fn: Callable[..., Any], *abstract_args: Any, mesh: Any, donate_argnums: Sequence[int] = ()) -> Any:
    """Compile a ``planner.intraop.shard`` result on ``mesh`` and compare with its prediction (a validate.shard_check.ShardCheck).

    validate imports planner, so planner reaches it only here, lazily, in its composition root.
    """
    from validate.shard_check import check_shard as compile_and_compare

    return compile_and_compare(result, fn, *abstract_args, mesh=mesh, donate_argnums=donate_argnums)
