"""Collectives over the data axes of the plan's program: gradient reductions, ZeRO's gathers, the embedding's gradient.

See `region_collectives` (data parallelism alone) and `data_parallel_collectives`;
`validate.predict.predicted_collectives` adds them to the tensor- and pipeline-parallel ones.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from costmodel.inputs.layout import Recompute
from costmodel.step.kernels import keeps_compute_copy
from planner.plan_schema import Plan
from planner.shardings import entry_axes, zero_sharded_specs
from validate.program_runs import F32_BYTES, PredictedCollective, ProgramRuns

# Weights of the matmuls whose output only the layer's output needs (dead in full recompute).
_LAST_MATMULS = ("mlp/w_out", "moe/w_out", "moe/shared_w_out")


# The head's gradients, the tied table's aside.
_HEAD_GRADIENTS = ("lm_head/w", "final_norm/scale", "final_norm/bias")


def _grad_bytes(name: str, elements: float, compute_bytes: int) -> float:
    """Gradient bytes as the program produces them: fp32 for what it uses in fp32."""
    fp32 = name.endswith(("scale", "norm/bias")) or name in ("embed/tokens", "lm_head/w", "final_norm/bias")
    return elements * (F32_BYTES if fp32 else compute_bytes)


def _is_bias(name: str) -> bool:
    """Bias vectors (``bo``, ``b_out``…), whose gradient needs no gathered copy of themselves."""
    return name.rsplit("/", 1)[-1].startswith("b")


def _data_split(spec: tuple[Any, ...], axes: tuple[str, ...], sizes: dict[str, int]) -> int:
    """How many ways ``spec`` splits an array over the mesh axes ``axes``."""
    return math.prod(sizes[a] for a in _axes_in(spec) if a in axes)


ParamShards = dict[str, tuple[float, tuple[Any, ...], tuple[int, ...]]]


def region_collectives(plan: Plan, runs: ProgramRuns, params: ParamShards, grad_specs: dict[str, tuple[Any, ...]], *,
                       platform: str) -> list[PredictedCollective]:
    """Collectives over the data axes of a plan whose gradients are formed in the data-parallel
    region (`validate.data_parallel_region`): the reductions each ZeRO stage needs and ZeRO-3's
    gathers. ``grad_specs`` is how the optimizer splits each gradient (its moments' specs)."""
    lay, train = plan.layout, plan.train
    data = plan.axes_of("dp")
    sizes = {a.name: a.size for a in plan.mesh}
    e, stored = train.compute_dtype.bytes, train.param_dtype.bytes  # stored: fp32 master weights, or bf16 ones
    copy = keeps_compute_copy(plan.model, train, lay)
    held = e if copy else stored  # ZeRO 1-2's weights: the master, or its compute copy
    whole = {n: el * _data_split(spec, data, sizes) for n, (el, spec, _) in params.items()}
    gathered = {n for n, (_, spec, _) in params.items() if lay.zero_stage == 3 and _data_split(spec, data, sizes) > 1}
    split = {n for n in whole if lay.zero_stage >= 1 and _data_split(grad_specs[n], data, sizes) > 1}

    def gathered_bytes(name: str) -> int:
        # Weight matrices are cast before their gather; the embedding tables are read as stored.
        matrix = len(params[name][2]) >= (3 if name.startswith("layers/") else 2)
        return e if matrix and not name.startswith("embed/") else stored

    # On the CPU backend the head's weight gradient is reduced straight from the fp32 conversion of
    # its bf16 product (where no accumulator lies between): `validate.hlo` reads that as XLA:CPU's
    # promotion of a bf16 reduction and counts it at bf16 bytes. Split over tensor axes, a copy
    # lies between (the per-replica program's layout change) and it is read as the fp32 it is.
    straight = platform == "cpu" and (lay.zero_stage >= 2 or runs.outer_calls == 1) and lay.tp == 1
    read_as_bf16 = {"lm_head/w"} if straight else set()
    if platform == "cpu" and lay.zero_stage == 2 and copy:
        # So is every gradient of a compute copy (`keeps_compute_copy`) under ZeRO 2, converted to fp32 just before
        # its reduce-scatter, but an untied table's, which the lookup's transpose scatters in fp32 there.
        read_as_bf16 |= {n for n in split if n != "embed/tokens" or plan.model.tie_embeddings}

    def summed_bytes(name: str) -> float:  # a gradient as summed: in the master weights' dtype
        return e if name in read_as_bf16 else stored

    def reduced_bytes(name: str) -> float:
        # The gathers' transposes reduce in the gathered dtype, but on the CPU backend in fp32 (`_gathered`).
        return (F32_BYTES / 2 if name in read_as_bf16 else F32_BYTES) if platform == "cpu" else gathered_bytes(name)

    out: list[PredictedCollective] = []

    def add(kind: str, names: set[str], per_element: Callable[[str], float], calls: int, why: str, *, per_layer: bool = False) -> None:
        total = sum(whole[n] * per_element(n) for n in names) / (runs.layers_held if per_layer else 1)
        if total:
            out.append(PredictedCollective(kind=kind, axes=data, bytes_per_call=total, calls=calls, why=why))

    layer_gathered = {n for n in gathered if n.startswith("layers/")}
    add("all-gather", layer_gathered, gathered_bytes, 2 * runs.layer_runs, per_layer=True,
        why="ZeRO-3: a layer's weights gathered for its forward and again for its backward (recomputed, not kept)")
    add("reduce-scatter", layer_gathered, reduced_bytes, runs.layer_runs, per_layer=True,
        why="ZeRO-3: a layer's weight gradients reduce-scattered in its backward, every micro-batch")
    add("all-gather", gathered - layer_gathered, gathered_bytes, 1,
        why="ZeRO-3: the embedding, head and final norm gathered once (XLA hoists the gather out of the micro-batch loop)")
    add("reduce-scatter", gathered - layer_gathered, reduced_bytes, runs.outer_calls,
        why="ZeRO-3: the embedding's and head's gradients reduce-scattered, every micro-batch")
    if lay.zero_stage == 2:
        add("reduce-scatter", split, summed_bytes, runs.outer_calls, why="ZeRO-2: the micro-batch's gradients reduce-scattered")
    else:
        add("reduce-scatter", split - gathered, summed_bytes, 1, why="ZeRO-1: the accumulated gradients reduce-scattered, once")
    add("all-reduce", set(whole) - split - gathered, summed_bytes, 1,
        why="accumulated gradients the optimizer does not split, all-reduced once per step")
    add("all-gather", split - gathered, lambda name: held, 1,
        why="ZeRO 1-2: the updated parameters gathered from their data shards, as held (the compute-dtype copy)")
    return out


def _summed_locally(plan: Plan, whole: dict[str, float], names: set[str]) -> list[PredictedCollective]:
    """A pipeline's gradients summed per data replica over its loop (`validate.split_backward`), held as the
    parameters are, reduced once after it: reduce-scattered into the optimizer's split under ZeRO 1, all-reduced
    where it splits nothing (and under ZeRO 0)."""
    data, stored = plan.axes_of("dp"), plan.train.param_dtype.bytes
    sizes = {a.name: a.size for a in plan.mesh}
    scattered: set[str] = set()
    if plan.layout.zero_stage >= 1:
        zero_specs = zero_sharded_specs(plan.model, plan.param_specs, data, sizes)
        scattered = {n for n in names if _data_split(zero_specs[n], data, sizes) > 1}
    how = {"reduce-scatter": "reduce-scattered into the optimizer state's split", "all-reduce": "all-reduced"}
    return [*(PredictedCollective(kind=kind, axes=data, bytes_per_call=sum(whole[n] for n in group) * stored, calls=1,
                                  why=f"layer and head gradients, summed per replica over the pipeline's loop, {how[kind]} once after it")
              for kind, group in (("reduce-scatter", scattered), ("all-reduce", names - scattered)) if group),
            PredictedCollective(kind="all-reduce", axes=data, bytes_per_call=F32_BYTES, calls=1, why="the replicas' mean losses averaged")]


def data_parallel_collectives(plan: Plan, runs: ProgramRuns, params: ParamShards,
                              experts_bytes: int) -> list[PredictedCollective]:
    """Collectives over the data axes of a plan whose gradients XLA reduces where they appear
    (beside tensor, context or pipeline axes, or LoRA): gradient reductions, ZeRO's gathers, the embedding's gradient.

    Gradients are all-reduced whole over the data axes once per micro-batch, also where ZeRO
    shards them (XLA reduces, then slices; it did not emit reduce-scatters). With ZeRO-3 each
    weight the data axes split is gathered in the compute dtype where it is used: a layer's
    weights once in its forward and once in its backward on every run, the head's twice per
    step (the gather does not depend on the micro-batch, so XLA hoists it out of the loop).

    Once gradients are sharded (ZeRO ≥ 1), a table not split over the vocabulary gets its
    lookup gradient from the rows of the embedding output's gradient, gathered with the
    micro-batch's tokens, instead of a whole-table reduction: an all-gather of the (compute
    dtype) rows for a separate table, where they are fewer than the table's rows (XLA
    reduced llama3-8b's 128256-row table whole for 131072 rows from 32 data devices; gpt2-xl's
    50257 rows on 8 it gathered, and a tied table's where ZeRO splits its rows); fp32 rows
    exchanged by an all-to-all, the table's reduction shared with the head's, for a tied one
    whose width ZeRO splits (rows the data axes do not divide) or one split over the data axes
    (ZeRO-3, whose lookup also exchanges the looked-up fp32 row slices). Learned positions are
    likewise reduced and gathered only for the rows a sequence uses, in the compute dtype.
    """
    model, lay, train = plan.model, plan.layout, plan.train
    data = plan.axes_of("dp")
    sizes = {a.name: a.size for a in plan.mesh}
    e = train.compute_dtype.bytes
    over = reduction_axes(plan, params)
    whole = {n: el * _data_split(spec, over[n], sizes) for n, (el, spec, _) in params.items()}  # elements before the data split
    split = {n for n, (_, spec, _) in params.items() if _data_split(spec, over[n], sizes) > 1}
    vocab, _ = params["embed/tokens"][1]
    # Tokens the embedding takes per execution: a pipeline embeds all its micro-batches at once.
    outer_tokens = runs.outer_micro_batches * lay.micro_batch * train.seq_len // lay.cp
    # ZeRO's gradient shard takes a tied table's rows where the data axes divide them (GPT-2's padded
    # 50304 on 4; `planner.shardings.zero_sharded_specs`): then XLA gathers the gradient rows in the
    # compute dtype, as for a separate table; where it takes the width (50257 rows), it exchanges fp32 rows.
    rows_split = params["embed/tokens"][2][0] % math.prod(sizes[a] for a in data) == 0 and vocab is None
    exchanged = (model.tie_embeddings and not rows_split) or "embed/tokens" in split
    # A separate table's rows are gathered only where they are fewer than the table's: XLA weighs the
    # scatter's fp32 updates against the fp32 table (llama3-8b's 131072 rows on 32 devices > 128256: reduced whole).
    fewer_rows = outer_tokens * lay.dp * model.hidden_size < whole["embed/tokens"]
    # Not the vocab-parallel lookup (`embedding_lookup`). A pipeline's embedding, outside its region on the whole batch,
    # takes the rows whatever their number under ZeRO 0-1 too (llama2-7b and a 512-wide model on pipeline=2,data=4).
    rows = vocab is None and (lay.zero_stage >= 1 and (exchanged or fewer_rows) or lay.pp > 1 and lay.zero_stage <= 1)
    # The experts' tensor-parallel region takes its weights and forms their gradients in its own dtype.
    element_bytes = {n: experts_bytes if experts_bytes and n.startswith("layers/moe/w_") else e for n in whole}
    experts = {n for n in whole if over[n] != data}
    layer_bytes = sum(_grad_bytes(n, whole[n], element_bytes[n]) / runs.layers_held for n in whole
                      if n.startswith("layers/") and n not in experts)
    other_bytes = sum(_grad_bytes(n, whole[n], e) for n in whole if not n.startswith("layers/"))
    positions = "embed/positions" in whole and rows
    if positions:
        other_bytes += train.seq_len * model.hidden_size * e - _grad_bytes("embed/positions", whole["embed/positions"], e)
    if rows and not model.tie_embeddings:
        other_bytes -= whole["embed/tokens"] * F32_BYTES
    elif model.tie_embeddings and not rows:  # the lookup's and the head's gradients of the shared table are reduced apart
        other_bytes += whole["embed/tokens"] * F32_BYTES
    head_bytes = (sum(_grad_bytes(n, whole[n], e) for n in _HEAD_GRADIENTS if n in whole)
                  + (whole["embed/tokens"] * F32_BYTES if model.tie_embeddings else 0))
    expert_axes = next((over[n] for n in experts), ())
    out = [
        *([PredictedCollective(kind="reduce-scatter" if lay.zero_stage == 3 else "all-reduce", axes=expert_axes, calls=runs.layer_runs,
                               bytes_per_call=sum(_grad_bytes(n, whole[n], element_bytes[n]) for n in experts) / runs.layers_held,
                               why="expert gradients summed over the data axes their expert axes leave as the experts' region "
                                   "ends (ZeRO-3: reduce-scattered to the shards it gathered), every micro-batch")]
          if expert_axes else []),
        PredictedCollective(kind="all-reduce", axes=data, bytes_per_call=other_bytes - head_bytes, calls=runs.outer_calls,
                            why="embedding gradients, every micro-batch (once when pipelined)"),
    ]
    if runs.summed_locally:
        head_names = set(_HEAD_GRADIENTS) | ({"embed/tokens"} if model.tie_embeddings else set())
        out += _summed_locally(plan, whole, {n for n in whole if n.startswith("layers/") and n not in experts} | (head_names & set(whole)))
    else:
        out += [PredictedCollective(kind="all-reduce", axes=data, bytes_per_call=layer_bytes, calls=runs.layer_runs,
                                    why="layer gradients, every micro-batch (every tick when pipelined)"),
                PredictedCollective(kind="all-reduce", axes=data, bytes_per_call=head_bytes, calls=runs.head_gradients,
                                    why="head and final-norm gradients, every micro-batch")]
    if rows:
        out.append(PredictedCollective(kind="all-gather", axes=data, bytes_per_call=outer_tokens * lay.dp * 4, calls=runs.outer_calls,
                                       why="ZeRO: the micro-batch's tokens, to find each table row's gradient"))
        if exchanged:
            out.append(PredictedCollective(
                kind="all-to-all", axes=data, bytes_per_call=outer_tokens * model.hidden_size * F32_BYTES,
                calls=(1 + ("embed/tokens" in split)) * runs.outer_calls,
                why="ZeRO: the embedding output's gradient rows (fp32), and with ZeRO-3 the looked-up row slices"))
        else:
            out.append(PredictedCollective(kind="all-gather", axes=data, bytes_per_call=outer_tokens * lay.dp * model.hidden_size * e,
                                           calls=runs.outer_calls, why="ZeRO: the embedding output's gradient rows"))
    if positions:
        split_positions = "embed/positions" in split
        out.append(PredictedCollective(kind="all-gather", axes=data, bytes_per_call=train.seq_len * model.hidden_size * e,
                                       calls=1 if split_positions else runs.outer_calls,
                                       why="ZeRO-3: the used position rows, once" if split_positions else
                                       "ZeRO: the used position rows' gradient"))
    layer_split = [n for n in split if n.startswith("layers/")]
    # With sequence parallelism XLA gathers again for full recompute's forward, but not the
    # weights of the layer's last matmuls, whose recomputation is dead code, nor the attention's
    # output projection, whose recompute and backward share one gather (its output's gradient is
    # pinned, `planner.programs.transformer._gathered_gradient`).
    regathered = lay.sequence_parallel and lay.recompute is Recompute.FULL
    weights = [n for n in layer_split if not _is_bias(n)]
    recomputed = [n for n in weights if regathered and not n.endswith((*_LAST_MATMULS, "attn/wo"))]
    for names, calls, why in (
        (weights, 2, "ZeRO-3: a layer's weights gathered for its forward and again for its backward"),
        (recomputed, 1, "ZeRO-3: a layer's weights gathered once more for full recompute (sequence parallel)"),
        ([n for n in layer_split if _is_bias(n)], 1, "ZeRO-3: a layer's biases gathered for its forward"),
    ):
        for axes, group in _by_axes(names, over):
            gathered = sum(whole[n] * element_bytes[n] for n in group)
            if gathered:
                out.append(PredictedCollective(kind="all-gather", axes=axes, bytes_per_call=gathered / runs.layers_held,
                                               calls=calls * runs.layer_runs, why=why))
    head = "embed/tokens" if model.tie_embeddings else "lm_head/w"
    if "embed/tokens" in split and not rows and not model.tie_embeddings:
        out.append(PredictedCollective(kind="all-gather", axes=data, bytes_per_call=whole["embed/tokens"] * F32_BYTES, calls=1,
                                       why="ZeRO-3: the vocab-parallel table gathered over the data axes (fp32, as stored), once"))
    if head in split:
        # A tied table is gathered whole in fp32: the lookup reads it as stored, the head casts the gathered copy.
        # A pipeline runs its head inside the schedule, apart from the lookup: it gathers its own cast copy.
        head_weight_bytes = whole[head] * (F32_BYTES if model.tie_embeddings and lay.pp == 1 else e)
        out.append(PredictedCollective(kind="all-gather", axes=data, bytes_per_call=head_weight_bytes, calls=2,
                                       why="ZeRO-3: the head's weight gathered for the forward and for the backward"))
        if model.tie_embeddings and vocab is not None:
            # The vocab-parallel lookup's region takes the table whole over the data axes: a gather of its own
            # (GPT-2 padded to 50304 rows, tp 4: three fp32 gathers of the table's 12576-row slice).
            out.append(PredictedCollective(kind="all-gather", axes=data, bytes_per_call=whole[head] * F32_BYTES, calls=1,
                                           why="ZeRO-3: the tied table gathered again for the vocab-parallel lookup (fp32)"))
    if lay.zero_stage >= 1:
        for axes, group in _by_axes([n for n in whole if n not in split], over):
            out.append(PredictedCollective(kind="all-gather", axes=axes, bytes_per_call=sum(whole[n] for n in group) * F32_BYTES, calls=1,
                                           why="ZeRO: updated fp32 parameters (those not kept split) gathered from their data shards"))
    return out


def reduction_axes(plan: Plan, params: ParamShards) -> dict[str, tuple[str, ...]]:
    """Parameter path → the data axes its gradient is summed over: all of them, but for a routed
    expert's weights those the expert axes leave (each expert lives on its own expert-axis devices).

    >>> from costmodel.inputs.layout import Layout
    >>> from planner.api import layout_plan
    >>> from validate.program_runs import param_shards
    >>> p = layout_plan("mixtral-8x7b", Layout(dp=16, ep=8, zero_stage=1), hardware="h100-sxm", global_batch=16, seq_len=512)
    >>> axes = reduction_axes(p, param_shards(p))
    >>> axes["layers/moe/w_in"], axes["layers/attn/wq"]
    (('data',), ('expert', 'data'))
    """
    data, experts = plan.axes_of("dp"), set(plan.axes_of("ep"))
    spread = {n for n, (_, spec, _) in params.items() if n.startswith("layers/moe/w_") and experts & set(_axes_in(spec))}
    return {n: tuple(a for a in data if a not in experts) if n in spread else data for n in params}


def _axes_in(spec: tuple[Any, ...]) -> tuple[str, ...]:
    return tuple(a for d in spec for a in entry_axes(d))


def _by_axes(names: list[str], over: dict[str, tuple[str, ...]]) -> list[tuple[tuple[str, ...], list[str]]]:
    """``names`` grouped by the axes they are reduced or gathered over (groups without axes dropped)."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for n in names:
        groups.setdefault(over[n], []).append(n)
    return [(axes, group) for axes, group in groups.items() if axes]
