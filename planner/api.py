"""The library entry point: ``planner.plan(request) -> Plan``, or ``planner.plan("llama3-8b", mesh="8x4", hardware="h100-sxm")``.

>>> p = plan("gpt2", mesh="2x4", hardware="a100-80gb", global_batch=64, seq_len=1024)
>>> p.layout.n_devices, [a.parallelism for a in p.mesh][:2] != []
(8, True)
>>> plan(PlanRequest(model="gpt2", mesh="2x4", hardware="a100-80gb", global_batch=64, seq_len=1024)) == p
True
"""

from __future__ import annotations

import math
from typing import Any, Callable

from costmodel.errors import InfeasibleError, InvalidConfigError, UnsupportedError
from costmodel.hardware.machine import Machine, train_machine
from costmodel.hardware.mesh import MeshSpec, axis_links, parse_mesh
from costmodel.hardware.profile import ClusterSpec
from costmodel.hardware.registry import load_hardware
from costmodel.inputs.layout import Layout, Offload, check_sequence
from costmodel.inputs.model_config import ModelConfig
from costmodel.inputs.stack import Attention, get_stack, stack_with
from costmodel.inputs.train_config import TrainConfig
from costmodel.step.estimate import StepEstimate
from costmodel.step.memory import min_state_bytes_per_device
from costmodel.step.run_overheads import RunSettings, run_overheads
from costmodel.step.simulator import simulate
from planner.batch import BatchChoice, devices_batch, given_batch, planned_batch, starved_warning
from planner.config import default_seq_len, load_model, model_notes, positions_note, train_config
from planner.mesh_assign import AXIS_NAMES, KINDS, TENSOR_EMBED, assignments, carrying, degrees, expert_degree
from planner.plan_schema import Alternative, IntraOpInfo, MeshAxis, Plan, SolverInfo
from planner.request import PlannerName, PlanRequest, plan_request
from planner.shardings import logical_rules, param_specs
from search.layouts import NothingFitsError, SearchResult, SearchSpace, grid_search
from search.pins import LayoutPins, pinned_failure, pinned_space, serving_splits
from search.serving_layouts import ServingChoice, choose_serving_layout

_GIB = 2**30
MAX_DEVICES = 2**24  # keeps enumerating degree splits well under a second
SERVING_BATCH = 1  # sequences per replica a serving request without global_batch serves, as `plan --batch` defaults
Report = Callable[[str, int, int | None], None]  # (phase, done, total or None when unknown)


def plan(request: PlanRequest | str | ModelConfig, /, *, progress: Report | None = None, **fields: Any) -> Plan:
    """Choose the fastest layout that fits for the request's model on its mesh (or on its device count).

    Args:
      request: a `PlanRequest`; or its model (preset name, config.json path, or a ModelConfig) with
        the request's other fields as keywords, ``plan("llama3-8b", mesh="8x4")``.
      progress: called as ``progress(phase, done, total)`` while the search runs.

    What the request's settings do here:
      planner: grid (layout search, rule-based Megatron shardings) or ilp (the same layout
        search, then the CP-SAT intra-op ILP shards each stage's training step on its sub-mesh),
        or anneal / beam / random, search planners on the ILP's strategy space.
      global_batch: sequences per step; None: the planner chooses it (`planner.batch`: DeepSeek LLM's
        fitted batch for the model and ``tokens``, a multiple of the devices) and ``batch.reason`` says
        why. A given batch the devices do not divide is planned again at the nearest one they do,
        and ``batch.warning`` names it when it runs at a clearly higher MFU. Serving: sequences
        per replica, default 1.
      time_limit_s: the layout search and the intra-op planner each stop after this many
        seconds and keep the best found; ``solver.status`` is then FEASIBLE, not OPTIMAL.
      attention: default the stack's for grid and materialized for the intra-op planners,
        which shard the reference program (it materializes the score matrix).
      stack: default "jax", the program `plan validate` lowers; another stack predicts how that
        framework would run the chosen layout.
      precision: tf32 runs fp32 storage with GEMMs at the tf32 peak, fp16 has fp16 gradients and
        dynamic loss scaling, fp8 runs the linear layers' GEMMs in fp8 as Transformer Engine does
        (`costmodel.step.fp8_memory`); a part without the dtype's peak is refused (`InvalidConfigError`).
      tokens: the prediction then says how long training takes (``time_to_train_s``: tokens /
        tokens_per_s at the chosen layout, plus ``input_overhead_s`` and ``checkpoint_overhead_s``,
        itemised in ``run_overheads``) and ``device_hours``, under ``run``'s checkpoint interval and loader.
      offload: "none" (never), "optimizer" (always: ZeRO-Offload's optimizer state and Adam on the
        host, `costmodel.step.offload`) or None, the planner's choice: offload only when no layout fits
        in device memory without, and say so in ``solver.offload_reason``.
      pins: layout parts fixed by hand (`search.pins.LayoutPins`: degrees, interleave, micro-batch,
        recompute, sequence parallelism, ZeRO stage); the search chooses the rest and ``solver.pins``
        records them. A pin the mesh, devices or model cannot carry is refused (`InvalidPlanError`);
        when nothing fits under the pins the error names the pin to drop. The intra-op planners honour
        micro-batch and recompute only (`UnsupportedError` otherwise), serving dp, tp and pp.
      workload: "finetune-full" plans the pretraining step; "finetune-lora" freezes the base weights
        and trains adapters (``lora``), planned by grid without pipeline stages (the validator lowers
        LoRA without them). "prefill" or "decode" serve the model (`search.serving_layouts`):
        ``global_batch`` sequences at a context of ``seq_len`` tokens, ``inference`` the rest.

    The plan holds no wall times, so the same request gives the same plan bytes.

    >>> p = plan("llama3-8b", mesh="8", workload="finetune-lora", global_batch=64)
    >>> p.workload, p.train.workload.lora.rank, p.predicted.memory.frozen_params_bytes > p.predicted.memory.optimizer_bytes
    ('finetune-lora', 16, True)
    >>> d = plan("llama3-8b", mesh="8", workload="decode", global_batch=64, seq_len=4096, inference={"max_token_latency_ms": 7})
    >>> d.layout.tp, d.predicted.time_per_output_token_s < 0.01, d.predicted.memory.kv_cache_bytes / 2**30
    (8, True, 4.0)
    """
    request = _as_request(request, fields)
    planner = request.planner
    mesh_spec, n_devices = _devices(request)
    cfg, train, batch = _model_and_train(request, n_devices)
    if not train.workload.trains_base_weights and planner.shards_intra_op:
        raise UnsupportedError(f"--planner {planner} shards the pretraining step only; {train.workload.kind} plans use the grid planner",
                               fix="drop --planner or use --planner grid")
    if train.is_fp8 and planner.shards_intra_op:
        raise UnsupportedError(f"--planner {planner} costs every GEMM at one peak; fp8 plans use the grid planner",
                               fix="drop --planner or use --planner grid")
    check_sequence(cfg, train)
    cluster = load_hardware(request.hardware, devices_per_node=request.devices_per_node).with_memory_reserve(reserve_bytes(request))
    machine = train_machine(cluster, train)
    software = get_stack(request.stack) if isinstance(request.stack, str) else request.stack
    pins, where = request.pins, f"mesh {request.mesh}" if mesh_spec else f"{n_devices} devices"
    kinds = assignments(mesh_spec, max_cp=pins.cp or 1) if mesh_spec else []
    splits = tuple(sorted({degrees(mesh_spec, k) for k in kinds})) if mesh_spec else None
    experts = tuple(sorted({expert_degree(k, mesh_spec.axis_sizes) for k in kinds})) if mesh_spec else None
    if not train.workload.runs_backward:  # serving: its own search
        splits = serving_splits(splits, pins, n_devices=n_devices, where=where, workload=train.workload.kind)
        return _serving_plan(cfg, train, cluster, machine, mesh=request.mesh, n_devices=n_devices, splits=splits, pins=pins)
    _check_any_cluster_holds(cfg, train, machine)
    # An intra-op planner shards the reference program, which materializes attention
    # scores: choose the layout (micro-batch, recompute) for that program's memory. Its
    # gradients are reduced where XLA puts them (`validate.intraop_program` pins every equation),
    # not as `validate.data_parallel_region` forms them.
    attention = request.attention or (Attention.MATERIALIZED if planner.shards_intra_op else software.attention)
    if planner.shards_intra_op:
        software = stack_with(software, manual_data_parallel=False)
    on_progress = (lambda done, total: progress("layout search", done, total)) if progress else None
    offload = request.offload
    unpinned = SearchSpace(splits=splits, expert_degrees=experts,
                           stack=Layout(stack=stack_with(software, attention=attention), offload=offload or Offload.NONE,
                                        offload_activations=request.offload_activations),
                           lowered_only=True, intra_op=planner.shards_intra_op,
                           offload_when_nothing_fits=offload is None and not planner.shards_intra_op,
                           loss_pieces_when_nothing_fits=not planner.shards_intra_op)
    space = pinned_space(cfg, train, unpinned, pins, n_devices=n_devices, where=where, devices_per_node=machine.devices_per_node)
    try:
        result = grid_search(cfg, train, machine, n_devices=n_devices, space=space, time_limit_s=request.time_limit_s,
                             on_progress=on_progress)
    except InfeasibleError as err:
        err = pinned_failure(err, cfg, train, machine, n_devices=n_devices, unpinned=unpinned, pins=pins, where=where,
                             time_limit_s=request.time_limit_s)
        if (offload is Offload.NONE and machine.host is not None and isinstance(err, NothingFitsError)
                and train.workload.trains_base_weights):
            raise InfeasibleError(err.cause, fix=f"{err.fix}, or let the optimizer state go to the host (--offload optimizer)") from None
        raise err from None
    best = result.best
    if batch.given:
        batch = _checked_batch(batch, best, search=lambda sequences: grid_search(
            cfg, train.model_copy(update={"global_batch": sequences}), machine, n_devices=n_devices, space=space,
            time_limit_s=request.time_limit_s), n_devices=n_devices)
    chosen = plan_of_layout(
        best.layout, with_training_time(best, request.tokens, model=cfg, train=train, cluster=cluster, run=request.run),
        model=cfg, train=train, cluster=cluster, mesh=request.mesh,
        alternatives=_alternatives(result.runners_up, result.closest_misses, best.step_time_s),
        solver=SolverInfo(planner=planner.value, status=_status(result.complete, None), evaluated=result.evaluated,
                          pruned=result.pruned, offload_reason=result.offload_reason,
                          loss_pieces_reason=result.loss_pieces_reason, pins=pins if pins.given else None),
        batch=batch,
    )
    if not planner.shards_intra_op:
        return chosen
    return _sharded_intra_op(chosen, request, machine, layouts_complete=result.complete, progress=progress)


def _as_request(request: PlanRequest | str | ModelConfig, fields: dict[str, Any]) -> PlanRequest:
    """``request`` itself, or the request of a model and keyword fields (the library's short form)."""
    if not isinstance(request, PlanRequest):
        return plan_request(model=request, **fields)
    if fields:
        raise TypeError(f"give {', '.join(fields)} in the PlanRequest, not beside it")
    return request


def _devices(request: PlanRequest) -> tuple[MeshSpec | None, int]:
    """The request's mesh (None when it gives a device count) and its device count."""
    if (request.mesh is None) == (request.devices is None):
        raise InvalidConfigError("give exactly one of --mesh and --devices", fix="e.g. --mesh 8x4 or --devices 32")
    mesh_spec = parse_mesh(request.mesh) if request.mesh is not None else None  # "" is a malformed mesh, not a missing one
    n_devices = mesh_spec.n_devices if mesh_spec else request.devices
    if n_devices > MAX_DEVICES:
        raise InvalidConfigError(f"{n_devices:,} devices exceed the {MAX_DEVICES:,} this planner supports",
                                 fix="plan one replica group and scale data parallelism by hand")
    return mesh_spec, n_devices


def _model_and_train(request: PlanRequest, n_devices: int) -> tuple[ModelConfig, TrainConfig, BatchChoice | None]:
    """The request's model config, its training (or serving) step settings, and the training batch
    with why (`planner.batch`: the rule's when the request gives none; None for serving)."""
    cfg = request.model if isinstance(request.model, ModelConfig) else load_model(request.model)
    seq_len = request.seq_len or default_seq_len(cfg)
    positions_note(cfg, seq_len)  # refuses a sequence beyond the model's positions
    train = train_config(seq_len=seq_len, global_batch=request.global_batch or SERVING_BATCH, workload=request.workload,
                         lora=request.lora, inference=request.inference, document_len=request.document_len
                         ).with_precision(request.precision)
    train = train.with_optimizer_state(request.optimizer_state, in_backward=request.optimizer_in_backward)
    if not train.workload.runs_backward:
        return cfg, train, None
    if request.global_batch is not None:
        return cfg, train, given_batch(request.global_batch, seq_len=seq_len)
    batch = planned_batch(cfg, seq_len=seq_len, n_devices=n_devices, tokens=request.tokens)
    return cfg, train.model_copy(update={"global_batch": batch.sequences}), batch


def _checked_batch(batch: BatchChoice, best: StepEstimate, *, search: Callable[[int], SearchResult], n_devices: int) -> BatchChoice:
    """``batch`` (given), with a warning when it starves the devices: the nearest batch the devices
    divide (`planner.batch.devices_batch`), planned by ``search``, runs at a clearly higher MFU."""
    better = devices_batch(batch.sequences, n_devices)
    if better is None:
        return batch
    try:
        other = search(better).best
    except InfeasibleError:
        return batch
    warning = starved_warning(batch.sequences, best.mfu, better_sequences=better, better_mfu=other.mfu,
                              layout_text=best.layout.degrees_text, better_layout_text=other.layout.degrees_text)
    return batch.model_copy(update={"warning": warning})


def _sharded_intra_op(chosen: Plan, request: PlanRequest, machine: Machine, *, layouts_complete: bool,
                      progress: Report | None) -> Plan:
    """``chosen`` with its parameter shardings from the request's intra-op planner, run on each stage's sub-mesh."""
    from planner.intraop.stage import intra_op_axes, intra_op_specs  # OR-Tools only when an intra-op planner is asked for

    ilp_axes = intra_op_axes(chosen.mesh)
    if not ilp_axes:
        return chosen
    name, time_limit_s = request.planner.value, request.time_limit_s
    if progress:
        progress(f"intra-op {name}: trace, build, solve (limit {time_limit_s:g} s)", 0, None)
    specs, intra_op = intra_op_specs(chosen.model, chosen.train, chosen.layout, ilp_axes, machine, planner=name,
                                     time_limit_s=time_limit_s, seed=request.seed)
    solver = chosen.solver.model_copy(update={"status": _status(layouts_complete, intra_op), "intra_op": intra_op})
    return Plan(**{field: getattr(chosen, field) for field in Plan.model_fields} | {"param_specs": specs, "solver": solver})


def _serving_plan(cfg: ModelConfig, train: TrainConfig, cluster: ClusterSpec, machine: Machine, *, mesh: str | None,
                  n_devices: int, splits: tuple[tuple[int, int, int, int], ...] | None, pins: LayoutPins) -> Plan:
    """The plan of a prefill or decode workload: the serving layout `choose_serving_layout` takes, Megatron shardings."""
    choice: ServingChoice = choose_serving_layout(cfg, train, machine, splits=splits, n_devices=n_devices)
    alternatives = tuple(Alternative(layout=e.layout, step_time_s=e.step_time_s, memory_bytes=e.memory.total_bytes, why=why)
                         for e, why in choice.runners_up)
    return plan_of_layout(choice.best.layout, choice.best, model=cfg, train=train, cluster=cluster, mesh=mesh, alternatives=alternatives,
                          solver=SolverInfo(planner=PlannerName.GRID.value, status="OPTIMAL", evaluated=choice.evaluated,
                                            pruned=choice.pruned, objective=choice.objective, pins=pins if pins.given else None))


def layout_plan(request: PlanRequest | str | ModelConfig, layout: Layout, /, **fields: Any) -> Plan:
    """The plan for a layout chosen by hand: mesh roles, Megatron shardings, simulated prediction.

    What a user compares with `plan`'s choice, and what the validator's timed checks run. Of the
    request (or its model and keyword fields, as for `plan`) it reads the model, the hardware, the
    mesh and the workload; the layout holds the rest. Without a mesh, one axis per parallelism
    (pipeline, data, context, tensor; major first).

    >>> p = layout_plan("gpt2", Layout(dp=2, tp=4, micro_batch=8), hardware="a100-80gb", global_batch=64, seq_len=1024)
    >>> [(a.name, a.size, a.parallelism) for a in p.mesh], p.param_specs["layers/mlp/w_in"]
    ([('data', 2, 'dp'), ('tensor', 4, 'tp')], (None, None, 'tensor'))
    """
    request = _as_request(request, fields)
    cfg, train, batch = _model_and_train(request, layout.n_devices)
    check_sequence(cfg, train)
    cluster = load_hardware(request.hardware, devices_per_node=request.devices_per_node).with_memory_reserve(reserve_bytes(request))
    machine = train_machine(cluster, train)
    estimate = simulate(cfg, train, layout, machine)
    layout = layout if train.workload.runs_backward else estimate.layout  # serving sets the micro-batch itself
    return plan_of_layout(layout, estimate, model=cfg, train=train, cluster=cluster, mesh=request.mesh,
                          solver=SolverInfo(planner="fixed", status="GIVEN", evaluated=1, pruned={}), batch=batch)


def plan_of_layout(layout: Layout, predicted: StepEstimate, *, model: ModelConfig, train: TrainConfig, cluster: ClusterSpec,
                   mesh: str | None, solver: SolverInfo, alternatives: tuple[Alternative, ...] = (),
                   batch: BatchChoice | None = None) -> Plan:
    """The `Plan` of a chosen layout: the axes of ``mesh`` in the roles that carry its degrees (without a
    mesh, one axis per parallelism, major first), their links on ``cluster``, the Megatron shardings on
    them, and the prediction, alternatives and solver as given. One assembly for the training search,
    the serving search and a layout given by hand.

    >>> from costmodel.hardware.catalog import CATALOG
    >>> from planner.config import load_model
    >>> cfg, train, lay = load_model("gpt2"), TrainConfig(seq_len=1024, global_batch=64), Layout(dp=2, tp=4, micro_batch=8)
    >>> est = simulate(cfg, train, lay, train_machine(CATALOG["a100-80gb"], train))
    >>> p = plan_of_layout(lay, est, model=cfg, train=train, cluster=CATALOG["a100-80gb"], mesh="4x2",
    ...                    solver=SolverInfo(planner="fixed", status="GIVEN", evaluated=1, pruned={}))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    costmodel.errors.InvalidConfigError: mesh 4x2 cannot carry dp=2, tp=4, pp=1, cp=1; fix: give a mesh whose axis sizes are ...
    >>> p = plan_of_layout(lay, est, model=cfg, train=train, cluster=CATALOG["a100-80gb"], mesh="2x4",
    ...                    solver=SolverInfo(planner="fixed", status="GIVEN", evaluated=1, pruned={}))
    >>> [(a.name, a.parallelism) for a in p.mesh], p.activation_specs["mlp_hidden_BxSxF"]
    ([('axis0', 'dp'), ('axis1', 'tp')], (('axis0',), None, ('axis1',)))
    """
    wanted = (layout.dp, layout.tp, layout.pp, layout.cp)
    if mesh is None:
        # A serving step's tensor axis over more devices than KV heads splits in two: the KV heads over the
        # first, each one's query heads over the second, so a device caches the one KV head it reads.
        kv_heads = None if train.workload.runs_backward else model.num_kv_heads
        mesh_spec, kinds = _derived_mesh(*wanted, layout.ep, tp_embed=layout.tp_embed, kv_heads=kv_heads)
    elif layout.tp_embed > 1:
        raise InvalidConfigError(f"a 2D weight-stationary layout ({layout.degrees_text}) runs on the mesh the planner derives, "
                                 f"not on {mesh}", fix="leave --mesh out (give --devices)")
    else:
        mesh_spec = parse_mesh(mesh)
        kinds = next((k for k in assignments(mesh_spec, max_cp=layout.cp) if degrees(mesh_spec, k) == wanted
                      and expert_degree(k, mesh_spec.axis_sizes) == layout.ep), None)
        if kinds is None:
            raise InvalidConfigError(f"mesh {mesh} cannot carry dp={layout.dp}, tp={layout.tp}, pp={layout.pp}, cp={layout.cp}"
                                     + (f", ep={layout.ep}" if layout.ep > 1 else ""),
                                     fix="give a mesh whose axis sizes are those degrees (an expert axis named expert=N), "
                                         "or leave the mesh out")
    axes = _mesh_axes(mesh_spec, kinds, cluster)
    by_kind = _axes_by_kind(axes)
    return Plan(
        model=model, train=train, hardware=cluster.name, mesh=axes, layout=layout,
        param_specs=param_specs(model, logical_rules(layout, by_kind, model), mesh_spec.shape),
        activation_specs=_activation_specs(layout, by_kind), predicted=predicted, alternatives=alternatives, solver=solver,
        batch=batch, model_notes=model_notes(model, train.seq_len),
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
    trained = train.workload.trainable_params(model)
    run_time = run_overheads(tokens=tokens, tokens_per_step=train.tokens_per_step, step_time_s=est.step_time_s,
                             n_devices=est.n_devices, trained_params=trained, train=train, vocab_size=model.vocab_size,
                             storage=cluster.storage, settings=run)
    return est.model_copy(update={"time_to_train_s": run_time.total_s, "device_hours": run_time.total_s * est.n_devices / 3600,
                                  "input_overhead_s": run_time.input_overhead_s,
                                  "checkpoint_overhead_s": run_time.checkpoint_overhead_s, "run_overheads": run_time})


def reserve_bytes(request: PlanRequest) -> float | None:
    """The request's runtime reserve in bytes (``--memory-reserve-gib``); None: the part's default."""
    return None if request.memory_reserve_gib is None else request.memory_reserve_gib * _GIB


def _check_any_cluster_holds(cfg: ModelConfig, train: TrainConfig, machine: Machine) -> None:
    """Refuse, by arithmetic on the parameter count, a model whose training state would not fit even
    spread over the largest cluster this planner takes; nearer misses get the search's closest layouts."""
    need_bytes = min_state_bytes_per_device(cfg, train, MAX_DEVICES)
    if need_bytes > machine.memory_budget_bytes:
        raise InfeasibleError(
            f"{cfg.name} cannot fit on any cluster: its {cfg.total_params:.3g} parameters' weights, gradients and optimizer "
            f"state alone need {need_bytes / _GIB:,.0f} GiB per device even spread over {MAX_DEVICES:,} devices, "
            f"more than the {machine.memory_budget_bytes / _GIB:.1f} GiB one {machine.name} leaves a plan",
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
    return {k: tuple(a.name for kind in carrying(k) for a in axes if a.parallelism == kind and a.size > 1)
            for k in (*KINDS, TENSOR_EMBED)}


def _activation_specs(lay: Layout, by_kind: dict[str, tuple[str, ...]]) -> dict[str, tuple]:
    data, tensor, embed = by_kind["dp"] or None, by_kind["tp"] or None, by_kind[TENSOR_EMBED]
    if embed:  # 2D weight-stationary: the residual stream's model dimension over the embed axes, the vocabulary over all
        return {"residual_BxSxD": (data, None, embed), "attention_heads_BxSxNxH": (data, None, tensor, None),
                "mlp_hidden_BxSxF": (data, None, tensor), "head_input_BxSxD": (data, None, None),
                "logits_BxSxV": (data, None, (*(tensor or ()), *embed))}
    return {
        "residual_BxSxD": (data, tensor if lay.sequence_parallel else None, None),
        "attention_heads_BxSxNxH": (data, None, tensor, None),
        "mlp_hidden_BxSxF": (data, None, tensor),
        "logits_BxSxV": (data, None, tensor),
    }


def _derived_mesh(dp: int, tp: int, pp: int, cp: int, ep: int, *, tp_embed: int = 1,
                  kv_heads: int | None = None) -> tuple[MeshSpec, tuple[str, ...]]:
    """One axis per parallelism, major first; with ``kv_heads`` (a serving plan) a 1D tensor axis over
    more devices than KV heads as two, ``tensor`` over the KV heads and ``tensor_query`` over their query heads."""
    sizes = {"pp": pp, "dp": dp // ep, "cp": cp, "ep": ep, TENSOR_EMBED: tp_embed, "tp": tp // tp_embed}
    kinds = tuple(k for k in ("pp", "dp", "cp", "ep", TENSOR_EMBED, "tp") if sizes[k] > 1) or ("dp",)
    names, axis_sizes = [AXIS_NAMES[k] for k in kinds], [sizes[k] for k in kinds]
    if kv_heads and tp_embed == 1 and tp > kv_heads and tp % kv_heads == 0:
        names[-1:], axis_sizes[-1:], kinds = ["tensor", "tensor_query"], [kv_heads, tp // kv_heads], (*kinds, "tp")
    return MeshSpec(axis_names=tuple(names), axis_sizes=tuple(axis_sizes)), kinds


def _alternatives(runners_up: tuple[StepEstimate, ...], misses: tuple[StepEstimate, ...], best_s: float) -> tuple[Alternative, ...]:
    out = [Alternative(layout=e.layout, step_time_s=e.step_time_s, memory_bytes=e.memory.total_bytes,
                       why=f"{100 * (e.step_time_s / best_s - 1):.1f} % slower ({e.step_time_s:.3f} s)") for e in runners_up]
    out += [Alternative(layout=e.layout, step_time_s=e.step_time_s, memory_bytes=e.memory.total_bytes,
                        why=f"does not fit: needs {e.memory.total_bytes / _GIB:.1f} GiB per device, over {e.memory.limit_text()}")
            for e in misses]
    return tuple(out)
