"""Collectives over the data axes of the plan's program: gradient reductions, ZeRO's gathers, the embedding's gradient.

See `data_parallel_collectives`; `validate.predict.predicted_collectives` adds them to the
tensor- and pipeline-parallel ones.
"""

from __future__ import annotations

import math
from typing import Any

from costmodel.inputs.layout import Recompute
from planner.plan_schema import Plan
from validate.program_runs import F32_BYTES, PredictedCollective, ProgramRuns

# Weights of the matmuls whose output only the layer's output needs (dead in full recompute).
_LAST_MATMULS = ("mlp/w_out", "moe/w_out", "moe/shared_w_out")


def _grad_bytes(name: str, elements: float, compute_bytes: int) -> float:
    """Gradient bytes as the program produces them: fp32 for what it uses in fp32."""
    fp32 = name.endswith(("scale", "norm/bias")) or name in ("embed/tokens", "lm_head/w", "final_norm/bias")
    return elements * (F32_BYTES if fp32 else compute_bytes)


def _is_bias(name: str) -> bool:
    """Bias vectors (``bo``, ``b_out``…), whose gradient needs no gathered copy of themselves."""
    return name.rsplit("/", 1)[-1].startswith("b")


def _data_split(spec: tuple[Any, ...], axes: tuple[str, ...], sizes: dict[str, int]) -> int:
    """How many ways ``spec`` splits an array over the mesh axes ``axes``."""
    return math.prod(sizes[a] for d in spec if d for a in ((d,) if isinstance(d, str) else d) if a in axes)


def data_parallel_collectives(plan: Plan, runs: ProgramRuns, params: dict[str, tuple[float, tuple[Any, ...], tuple[int, ...]]],
                              experts_bytes: int) -> list[PredictedCollective]:
    """Collectives over the data axes: gradient reductions, ZeRO's gathers, the embedding's gradient.

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
    50257 rows on 8 it gathered); fp32 rows exchanged by an all-to-all, the table's
    reduction shared with the head's, for a tied one or one split over the data axes
    (ZeRO-3, whose lookup also exchanges the looked-up fp32 row slices). Learned positions are
    likewise reduced and gathered only for the rows a sequence uses, in the compute dtype.
    """
    model, lay, train = plan.model, plan.layout, plan.train
    data = plan.axes_of("dp")
    sizes = {a.name: a.size for a in plan.mesh}
    e = train.compute_dtype.bytes
    whole = {n: el * _data_split(spec, data, sizes) for n, (el, spec, _) in params.items()}  # elements before the data split
    split = {n for n, (_, spec, _) in params.items() if _data_split(spec, data, sizes) > 1}
    vocab, _ = params["embed/tokens"][1]
    # Tokens the embedding takes per execution: a pipeline embeds all its micro-batches at once.
    outer_tokens = runs.outer_micro_batches * lay.micro_batch * train.seq_len // lay.cp
    exchanged = model.tie_embeddings or "embed/tokens" in split
    # A separate table's rows are gathered only where they are fewer than the table's: XLA weighs the
    # scatter's fp32 updates against the fp32 table (llama3-8b's 131072 rows on 32 devices > 128256: reduced whole).
    fewer_rows = outer_tokens * lay.dp * model.hidden_size < whole["embed/tokens"]
    rows = lay.zero_stage >= 1 and vocab is None and (exchanged or fewer_rows)  # not the vocab-parallel lookup (`embedding_lookup`)
    # The experts' tensor-parallel region takes its weights and forms their gradients in its own dtype.
    element_bytes = {n: experts_bytes if experts_bytes and n.startswith("layers/moe/w_") else e for n in whole}
    layer_bytes = sum(_grad_bytes(n, whole[n], element_bytes[n]) / runs.layers_held for n in whole if n.startswith("layers/"))
    other_bytes = sum(_grad_bytes(n, whole[n], e) for n in whole if not n.startswith("layers/"))
    positions = "embed/positions" in whole and rows
    if positions:
        other_bytes += train.seq_len * model.hidden_size * e - _grad_bytes("embed/positions", whole["embed/positions"], e)
    if rows and not model.tie_embeddings:
        other_bytes -= whole["embed/tokens"] * F32_BYTES
    elif model.tie_embeddings and not rows:  # the lookup's and the head's gradients of the shared table are reduced apart
        other_bytes += whole["embed/tokens"] * F32_BYTES
    head_bytes = (sum(_grad_bytes(n, whole[n], e) for n in ("lm_head/w", "final_norm/scale", "final_norm/bias") if n in whole)
                  + (whole["embed/tokens"] * F32_BYTES if model.tie_embeddings else 0))
    out = [
        PredictedCollective(kind="all-reduce", axes=data, bytes_per_call=layer_bytes, calls=runs.layer_runs,
                            why="layer gradients, every micro-batch (every tick when pipelined)"),
        PredictedCollective(kind="all-reduce", axes=data, bytes_per_call=other_bytes - head_bytes, calls=runs.outer_calls,
                            why="embedding gradients, every micro-batch (once when pipelined)"),
        PredictedCollective(kind="all-reduce", axes=data, bytes_per_call=head_bytes, calls=runs.head_gradients,
                            why="head and final-norm gradients, every micro-batch"),
    ]
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
    # weights of the layer's last matmuls, whose recomputation is dead code.
    regathered = lay.sequence_parallel and lay.recompute is Recompute.FULL
    weights = [n for n in layer_split if not _is_bias(n)]
    recomputed = [n for n in weights if regathered and not n.endswith(_LAST_MATMULS)]
    for names, calls, why in (
        (weights, 2, "ZeRO-3: a layer's weights gathered for its forward and again for its backward"),
        (recomputed, 1, "ZeRO-3: a layer's weights gathered once more for full recompute (sequence parallel)"),
        ([n for n in layer_split if _is_bias(n)], 1, "ZeRO-3: a layer's biases gathered for its forward"),
    ):
        gathered = sum(whole[n] * element_bytes[n] for n in names)
        if gathered:
            out.append(PredictedCollective(kind="all-gather", axes=data, bytes_per_call=gathered / runs.layers_held,
                                           calls=calls * runs.layer_runs, why=why))
    head = "embed/tokens" if model.tie_embeddings else "lm_head/w"
    if "embed/tokens" in split and not rows and not model.tie_embeddings:
        out.append(PredictedCollective(kind="all-gather", axes=data, bytes_per_call=whole["embed/tokens"] * F32_BYTES, calls=1,
                                       why="ZeRO-3: the vocab-parallel table gathered over the data axes (fp32, as stored), once"))
    if head in split:
        # A tied table is gathered whole in fp32: the lookup reads it as stored, the head casts the gathered copy.
        head_weight_bytes = whole[head] * (F32_BYTES if model.tie_embeddings else e)
        out.append(PredictedCollective(kind="all-gather", axes=data, bytes_per_call=head_weight_bytes, calls=2,
                                       why="ZeRO-3: the head's weight gathered for the forward and for the backward"))
    if lay.zero_stage >= 1:
        gathered = sum(whole[n] for n in whole if n not in split) * F32_BYTES
        out.append(PredictedCollective(kind="all-gather", axes=data, bytes_per_call=gathered, calls=1,
                                       why="ZeRO: updated fp32 parameters (those not kept split) gathered from their data shards"))
    return out
