"""What a LoRA plan's program (`validate.lowering`, ``--workload finetune-lora``)
takes as arguments, computes and communicates per device: the LoRA branch of `validate.predict`.

- Arguments: the frozen base weights as stored (each by the plan's spec; layer weights in the
  frozen dtype, the rest in the compute dtype), the adapters' fp32 master copies and AdamW
  moments (by `planner.programs.lora.adapter_specs`, moments split over the data axes from
  ZeRO 1), the batch.
- Matmul FLOPs: a frozen weight's matmul runs forward and for its input gradient only (twice
  its forward, not three times), the head's too; attention as in pretraining; every adapter
  GEMM three times its forward (its ``A`` is whole on each tensor-parallel device of a
  column-parallel matrix, its ``B`` of a row-parallel one, so that half is not divided).
- Memory per device: the simulator's (`validate.predict.predicted_memory_bytes`), and on the
  CPU backend, which has no 16-bit or integer matmuls, an fp32 copy of every frozen layer
  weight: XLA converts the stacked weights once, outside the layer loop (the compiled module
  holds ``f32[layers, ...]`` copies of them), where a GPU reads them as stored. Frozen int8/int4
  weights are not copied so; their CPU peak is not predicted well yet (llama3-70b, int4, one
  device: 0.57 of the compiled peak).
- Collectives, over the tensor axes: pretraining's (`validate.predict`), with the head's
  input gradient in the compute dtype (the head's weight is stored so), three ``[tokens]``
  loss reductions rather than four, and a ``[tokens, r]`` sum per adapter: of a
  row-parallel matrix's ``x·A`` in forward (again under full recompute), of a
  column-parallel one's ``dy·Bᵀ`` in backward. Over the data axes: each layer's adapter
  gradients (compute dtype) once per micro-batch, and from ZeRO 1 the updated fp32 adapters
  gathered once. The frozen embedding and head have no gradient to reduce.

Not predicted (reported as such): ZeRO 3 (XLA gathers the frozen table and head with
all-to-alls of their rows), sequence parallelism, and pipelines (not lowered).
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from costmodel.inputs.layout import Recompute
from costmodel.inputs.workload import FrozenDtype, adapted_matrices
from costmodel.workloads import Pretrain
from planner.plan_schema import Plan
from planner.programs.lora import adapter_shapes, adapter_specs, frozen_dtype_of
from planner.shardings import entry_axes
from validate.predict import predicted_collectives, predicted_matmul_flops, predicted_memory_bytes
from validate.program_runs import F32_BYTES, PredictedCollective, param_shards


def lora_unpredicted_features(plan: Plan) -> list[str]:
    """Features of a LoRA plan whose collectives `lora_collectives` does not model."""
    lay = plan.layout
    features = {"LoRA with ZeRO 3": lay.zero_stage >= 3 and lay.dp > 1, "LoRA with sequence parallelism": lay.sequence_parallel,
                "LoRA with pipeline stages": lay.pp > 1, "context parallelism": lay.cp > 1, "expert parallelism": lay.ep > 1}
    return [name for name, on in features.items() if on]


def _split(spec: tuple, sizes: dict[str, int], axes: tuple[str, ...] | None = None) -> int:
    return math.prod(sizes[a] for d in spec for a in entry_axes(d) if axes is None or a in axes)


def adapter_elements_per_device(plan: Plan, *, data_whole: bool = False) -> float:
    """Adapter elements one device holds under their specs (``data_whole``: before any split
    over the data axes, as their gradients are reduced)."""
    sizes = {a.name: a.size for a in plan.mesh}
    data = plan.axes_of("dp")
    specs = adapter_specs(plan.model, plan.train.workload.lora, plan.param_specs)
    return sum(math.prod(shape) * (_split(specs[p], sizes, data) if data_whole else 1) / _split(specs[p], sizes)
               for p, shape in adapter_shapes(plan.model, plan.train.workload.lora).items())


def lora_argument_bytes(plan: Plan) -> float:
    """Bytes of the LoRA step's arguments on one device (see the module docstring).

    >>> from costmodel.inputs.layout import Layout
    >>> from planner.api import layout_plan
    >>> p = layout_plan("llama3-8b", Layout(dp=8, micro_batch=1), global_batch=8, seq_len=2048, workload="finetune-lora")
    >>> round(lora_argument_bytes(p) / 2**30, 2)  # 16.06 GB of bf16 weights, 13.6 M adapters with their moments
    15.11
    """
    lay, train = plan.layout, plan.train
    frozen = sum(el * jnp.dtype(frozen_dtype_of(path, train)).itemsize for path, (el, _, _) in param_shards(plan).items())
    if train.workload.lora.frozen_dtype.value == "int4":  # jnp's itemsize of int4 is 1; XLA packs two per byte
        frozen -= sum(el / 2 for path, (el, _, _) in param_shards(plan).items() if frozen_dtype_of(path, train) == jnp.int4)
    adapters = adapter_elements_per_device(plan)
    moments = adapters * 2 * train.optimizer_dtype.bytes / (lay.dp if lay.zero_stage in (1, 2) else 1)
    batch = 2 * train.global_batch * train.seq_len * 4 / (lay.dp * lay.cp)  # int32 tokens and targets
    return frozen + adapters * train.param_dtype.bytes + moments + batch


def lora_memory_bytes(plan: Plan, *, platform: str = "gpu") -> float:
    """The per-device memory the LoRA program should peak at on ``platform`` (see the module docstring)."""
    total = predicted_memory_bytes(plan, platform=platform)
    if platform == "cpu" and plan.train.workload.lora.frozen_dtype is FrozenDtype.BF16:
        total += sum(el for path, (el, _, _) in param_shards(plan).items() if path.startswith("layers/")) * F32_BYTES
    return total


def _pretraining_twin(plan: Plan) -> Plan:
    """The same plan pretraining the model: the rules LoRA's program shares with it."""
    return plan.model_copy(update={"train": plan.train.model_copy(update={"workload": Pretrain()})})


def _adapter_matmul_flops_per_token(plan: Plan) -> float:
    """Forward FLOPs of one layer's adapter GEMMs per token on one device (the split half divided by tp)."""
    t, r = plan.layout.tp, plan.train.workload.lora.rank
    return sum(2 * r * (a.d_in + a.d_out / t if a.split == "column" else a.d_in / t + a.d_out)
               for a in adapted_matrices(plan.model, plan.train.workload.lora))


def lora_matmul_flops(plan: Plan) -> float:
    """Matmul FLOPs per device per step of the LoRA program: pretraining's (`validate.predict.predicted_matmul_flops`)
    less the frozen weights' and the head's weight-gradient GEMMs, plus the adapters' GEMMs
    (three times their forward; once more under full recompute)."""
    model, lay, train = plan.model, plan.layout, plan.train
    micro_tokens = lay.micro_batch * train.seq_len / lay.cp
    layer_runs = model.num_layers * lay.micro_batches(train)
    weight_grads = 2 * model.active_params_per_layer / lay.tp  # per token per layer, the GEMMs LoRA skips
    head_w = plan.param_specs["embed/tokens"][0] if model.tie_embeddings else plan.param_specs["lm_head/w"][1]
    head_grad = 2 * model.hidden_size * model.padded_vocab_size / (lay.tp if head_w is not None else 1)
    adapters = _adapter_matmul_flops_per_token(plan) * (3 + (lay.recompute is Recompute.FULL))
    return (predicted_matmul_flops(_pretraining_twin(plan))
            + micro_tokens * (layer_runs * (adapters - weight_grads) - lay.micro_batches(train) * head_grad))


def lora_collectives(plan: Plan, *, platform: str = "gpu") -> list[PredictedCollective]:
    """The collectives of one step of the LoRA program (see the module docstring)."""
    lay, train = plan.layout, plan.train
    tensor, data = plan.axes_of("tp"), plan.axes_of("dp")
    e = train.compute_dtype.bytes
    layer_runs = plan.model.num_layers * lay.micro_batches(train)
    out = []
    for c in predicted_collectives(_pretraining_twin(plan), platform=platform):
        if c.axes != tensor or not tensor:
            continue
        if c.why.startswith("vocab-parallel head input gradient"):
            c = c.model_copy(update={"bytes_per_call": c.bytes_per_call * e / F32_BYTES, "why": "vocab-parallel head input gradient"})
        elif c.why.startswith("softmax max and sum"):
            c = c.model_copy(update={"bytes_per_call": c.bytes_per_call * 3 / 4, "why": "softmax max and sum over the vocabulary split"})
        out.append(c)
    if tensor:
        adapters = adapted_matrices(plan.model, train.workload.lora)
        rows = sum(a.split == "row" for a in adapters) * (2 if lay.recompute is Recompute.FULL else 1)
        cols = sum(a.split == "column" for a in adapters)
        rank_bytes = lay.micro_batch * train.seq_len * train.workload.adapter_rank * e
        for count, why in ((rows, "LoRA: a row-parallel adapter's x·A summed over the tensor axes, forward (and recompute)"),
                           (cols, "LoRA: a column-parallel adapter's dy·Bᵀ summed over the tensor axes, backward")):
            if count:
                out.append(PredictedCollective(kind="all-reduce", axes=tensor, bytes_per_call=rank_bytes, calls=count * layer_runs,
                                               why=why))
    if data:
        per_layer = adapter_elements_per_device(plan, data_whole=True) / plan.model.num_layers
        out.append(PredictedCollective(kind="all-reduce", axes=data, bytes_per_call=per_layer * e, calls=layer_runs,
                                       why="LoRA: each layer's adapter gradients, every micro-batch"))
        if lay.zero_stage >= 1:
            gathered = adapter_elements_per_device(plan, data_whole=True) * F32_BYTES
            out.append(PredictedCollective(kind="all-gather", axes=data, bytes_per_call=gathered, calls=1,
                                           why="ZeRO: updated fp32 adapters gathered from their data shards"))
    return out
